// `kvlab bench cache`: what a cache policy and buffer cost, as ratios measured in one run —
// SDPA with attention-weight sums vs without, h2o vs lastrec chunk throughput, quantized vs
// default buffers, and the exact KV bytes per token of every buffer (vs bf16).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench_table.h"

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

// `kvlab bench kivi`: decode SDPA (one query per head) over a KIVI-2 buffer vs the default f32
// buffer at each context, per layer: KV bytes read per decode step and time (target: time <=
// 0.5x at the longest context). Shapes: heads, KV heads, head size (SmolLM2-135M by default).
struct KiviBenchOptions {
    int64_t heads = 9, kv_heads = 3, head_dim = 64;
    std::vector<int64_t> contexts = {8192, 32768};
    int bits = 2;
    int64_t group = 32, residual = 128;
    double min_seconds = 0.3;
    int rounds = 5;  // f32 and kivi timed back to back per round; rows give best times and min/median ratios
    // Row formats timed the same way: a decode step of one of two layers (write one token, then
    // attention), half of a step of both. Formats that attend over their codes (fp8, nvfp4,
    // mxfp4, turboquant) read only those; the others share the dequantized working buffer
    // (associate: write back the other layer's rows and dequantize this one, SDPA over the f32
    // copy).
    std::vector<std::string> formats = {"q8", "q4_0", "fp8_e4m3", "fp8_e5m2", "nvfp4", "mxfp4", "k8v4", "kfp8vfp4", "turboquant"};
};
// One format at one context in `kvlab bench kivi`: bytes a decode step reads and its time, each
// against the f32 buffer; the target (when there is one) applies to the median per-round ratio,
// the figure that load hitting both sides alike does not move.
struct KiviBenchRow {
    std::string what;        // "decode sdpa kivi2", "decode step fp8_e4m3"
    int64_t context = 0;
    double bytes = 0, f32_bytes = 0;
    double ms = 0, f32_ms = 0;          // best times of all rounds
    double round_min = 0, round_median = 0;
    int rounds = 0;
    double target = 0;                  // <= target on round_median; 0: none
    bool pass() const { return target <= 0 || round_median <= target; }
};

// The a / b table of `kvlab bench cache`, `kivi` and `quest`: measurement, a, b, a/b, target, unit.
void fill_ab_table(BenchTable& t, const std::vector<CacheBenchRow>& rows);
// One row per format and context: bytes ratio, both times, best-time ratio, per-round ratios.
void fill_kivi_table(BenchTable& t, const std::vector<KiviBenchRow>& rows);

std::vector<KiviBenchRow> run_kivi_bench(const KiviBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

std::vector<CacheBenchRow> run_cache_bench(const CacheBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

// `kvlab bench policies`: bench/policy_bench.h.

}  // namespace kv::bench
