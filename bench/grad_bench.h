// `kvlab bench grad`: one gradient step with the cache policy in place against the forward-only
// pass of the same batch (same model, cache, chunks), measured in one run; peak memory by
// category of each phase; and the host<->device bytes a step moves in the offload modes
// (weights in host memory, row-sized shards copied for phase 2; checkpoints always on the host).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/memory/memory_tracker.h"

namespace kv::bench {

struct GradBenchOptions {
    std::string model = "small";
    std::string cache = "h2o-default";
    int64_t tokens = 16384;
    int64_t cache_length = 4096;
    int64_t chunk = 512;
    int64_t layers_per_cell = 1;
    double chunks_per_cell_multiplier = 1.0;
    std::string mode = "lora";  // lora | full
    int repeats = 1;
};

struct GradBenchResult {
    std::string model, cache, mode;
    int64_t tokens = 0, cells = 0, rows = 0;
    double forward_s = 0;  // forward-only pass (the eval path)
    double step_s = 0;     // gradient step: phase 1 + phase 2
    double phase1_s = 0, phase2_s = 0;
    double ratio() const { return forward_s > 0 ? step_s / forward_s : 0; }
    std::vector<DeviceMemoryStats> forward_memory, phase1_memory, phase2_memory;
    size_t weight_bytes = 0, trainable_bytes = 0;
    size_t layer_checkpoint_bytes = 0, kv_checkpoint_bytes = 0;
    // offload modes: bytes a step copies host -> device and back
    size_t offload_h2d = 0, offload_d2h = 0;
};

GradBenchResult run_grad_bench(const GradBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
