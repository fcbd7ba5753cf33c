// `kvlab eval_long` / `kvlab infer`: run samples through the chunked driver with a cache policy
// and print loss/accuracy (or perplexity), throughput, KV bytes and peak memory by category.
#include <cstdio>

#include "commands.h"
#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/run/evaluate.h"
#include "progress.h"
#include "run_options.h"
#include "run_session.h"

namespace kv::cli {

ModelOptions model_options_for(const RunConfig& cfg) {
    ModelOptions opt;
    opt.dtype = cfg.dtype == "bf16" ? DType::BF16 : DType::F32;
    opt.rope = rope_mode_from_name(cfg.rope);
    opt.mla_cache = mla_cache_choice(cfg);
    opt.device = parse_device(cfg.device);
    opt.weights = cfg.model_weights;
    return opt;
}

void print_memory_table(const std::vector<DeviceMemoryStats>& stats) {
    for (const auto& s : stats) {
        std::printf("peak memory on %s: total %s |", s.device.is_cpu() ? "cpu" : str("cuda:", s.device.index).c_str(),
                    format_bytes(s.peak_total).c_str());
        for (size_t c = 0; c < kNumMemCategories; ++c)
            if (s.peak[c]) std::printf(" %s %s", mem_category_name(MemCategory(c)), format_bytes(s.peak[c]).c_str());
        std::printf("\n");
    }
}

int cmd_eval(int argc, char** argv, int first, const std::string& mode) {
    Args args(argc, argv, first, run_option_specs());
    if (args.flag("help")) {
        print_run_help(mode);
        return 0;
    }
    apply_global_options(args);
    if (args.positional().empty()) throw UsageError(str(mode, ": missing MODEL; expected e.g. kvlab ", mode, " tiny --data passkey"));
    return run_mode_in_session(args, mode);
}

}  // namespace kv::cli
