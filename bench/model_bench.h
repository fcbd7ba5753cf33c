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
    // "f32", "bf16" (weights dequantized at load) and "packed" (GGUF blocks kept in memory,
    // f32 activations; the default list adds it for GGUF models).
    std::vector<std::string> dtypes = {"f32", "bf16"};
    double min_seconds = 0.3;
};

// Memory of one model configuration after its measurements.
struct ModelBenchMemory {
    std::string dtype;
    int64_t weight_bytes = 0;          // the model's weights as stored
    int64_t tracked_weights_peak = 0;  // the tracked allocator's peak of category weights (load included)
    int64_t tracked_peak = 0;          // its peak over every category
    int64_t rss_peak = 0;              // the process's VmHWM so far (/proc/self/status), 0 if unknown
};

// The process's peak resident set (VmHWM) in bytes; 0 when /proc/self/status cannot be read.
int64_t process_peak_rss();
// Whether `model` names a GGUF model (a .gguf file or smollm2-135m).
bool is_gguf_model(const std::string& model);

// `memory` (optional) receives one entry per dtype, in order.
std::vector<ModelBenchRow> run_model_bench(const ModelBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress,
                                           std::vector<ModelBenchMemory>* memory = nullptr);

}  // namespace kv::bench
