// `kvlab bench model`: prefill and decode throughput of a model against this machine's floors
// measured in the same run — prefill against model FLOPs / raw oneDNN matmul rate, decode
// against bytes read per token / streaming-triad bandwidth.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kv::bench {

struct ModelBenchRow {
    std::string name;       // "prefill 2048 f32"
    double tokens_per_s = 0;
    double floor_tokens_per_s = 0;  // what the machine's measured ceiling allows
    std::string floor_basis;        // "2.35 TFLOP at 185 GFLOP/s"
    double target = 0;
    double ratio() const { return floor_tokens_per_s > 0 ? tokens_per_s / floor_tokens_per_s : 0; }
    bool pass() const { return ratio() >= target; }
};

struct ModelBenchOptions {
    std::string model = "qwen2.5-0.5b";
    int64_t prefill_tokens = 2048;
    int64_t decode_context = 4096;
    int64_t decode_tokens = 16;
    std::vector<std::string> dtypes = {"f32", "bf16"};
    double min_seconds = 0.3;
};

std::vector<ModelBenchRow> run_model_bench(const ModelBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
