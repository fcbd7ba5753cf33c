// `kvlab eval_long` / `kvlab infer`: run samples through the chunked driver with a cache policy
// and print loss/accuracy (or perplexity), throughput, KV bytes and peak memory by category.
#include <cstdio>

#include "commands.h"
#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/run/evaluate.h"
#include "progress.h"
#include "run_options.h"

namespace kv::cli {

ModelOptions model_options_for(const RunConfig& cfg) {
    ModelOptions opt;
    opt.dtype = cfg.dtype == "bf16" ? DType::BF16 : DType::F32;
    opt.rope = rope_mode_from_name(cfg.rope);
    if (cfg.device.rfind("cuda:", 0) == 0) opt.device = Device{DeviceType::CUDA, std::atoi(cfg.device.c_str() + 5)};
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
    RunConfig cfg = run_config_from_args(args, mode);
    LoadedModel lm = load_model(cfg.model, model_options_for(cfg), cfg.model_seed);
    std::printf("kvlab %s: model %s (%lld layers, width %lld), cache %s (L=%lld, chunk %lld), data %s: %lld x %lld tokens\n",
                mode.c_str(), lm.source.c_str(), (long long)lm.config.num_layers, (long long)lm.config.hidden_size,
                cfg.kv_cache.name.c_str(), (long long)cfg.kv_cache.cache_length, (long long)cfg.driver.chunk_size,
                cfg.data.name.c_str(), (long long)cfg.data.num_samples, (long long)cfg.data.seq_length);
    Progress progress(mode);
    EvalCallbacks cb;
    cb.progress = [&](int64_t d, int64_t t, const std::string& what) { progress.update(d, t, what); };
    const bool verbose = mode == "infer";
    cb.on_sample = [&](const EvalSampleResult& r) {
        if (!verbose) return;
        progress.finish();
        std::printf("  sample %lld: %s | loss %.4f | predicted %d, answer %d %s | %.2fs\n", (long long)r.index, r.description.c_str(),
                    r.loss, r.prediction, r.label, r.correct ? "(correct)" : "", r.seconds);
    };
    EvalSummary s = run_eval(cfg, lm, cb);
    progress.finish();
    std::printf("result: ");
    if (s.accuracy >= 0) std::printf("accuracy %.3f (%zu samples) | ", s.accuracy, s.samples.size());
    if (s.perplexity >= 0) std::printf("perplexity %.3f | ", s.perplexity);
    std::printf("mean loss %.4f | %.1f tokens/s | %lld chunks per sample\n", s.mean_loss, s.tokens_per_s, (long long)s.chunks_per_sample);
    std::printf("kv cache: %s in %s (%.2f bits per element)\n", s.cache_name.c_str(), format_bytes((long long)s.kv_bytes).c_str(),
                s.kv_bits_per_element);
    print_memory_table(s.memory);
    return 0;
}

}  // namespace kv::cli
