// `kvlab bench cache`: what a cache policy and buffer cost, as ratios measured in one run —
// SDPA with attention-weight sums vs without, h2o vs lastrec chunk throughput, quantized vs
// default buffers, and the exact KV bytes per token of every buffer (vs bf16).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kv::bench {

struct CacheBenchRow {
    std::string name;
    double a = 0, b = 0;     // the two measurements compared (seconds, tokens/s or bytes)
    std::string unit;
    double ratio = 0;        // a / b
    double target = 0;
    bool at_most = false;    // true: ratio <= target passes; false: ratio >= target
    bool pass() const { return target <= 0 || (at_most ? ratio <= target : ratio >= target); }
};

struct CacheBenchOptions {
    std::string model = "qwen2.5-0.5b";
    int64_t context = 32768;   // the sequence the chunk belongs to (positions)
    int64_t cache_length = 4096;
    int64_t chunk = 512;
    int chunks_timed = 2;
    double min_seconds = 0.3;
};

std::vector<CacheBenchRow> run_cache_bench(const CacheBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
