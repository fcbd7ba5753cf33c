// `kvlab bench grad`: gradient step vs forward-only pass, peak memory per phase, offload bytes.
#include <cstdio>

#include "bench_commands.h"
#include "bench/grad_bench.h"
#include "engine/core/error.h"
#include "progress.h"

namespace kv::cli {

namespace {
void print_memory(const char* what, const std::vector<DeviceMemoryStats>& stats) {
    for (const auto& s : stats) {
        std::printf("  %-22s peak %9.2f MiB:", what, double(s.peak_total) / (1 << 20));
        for (size_t k = 0; k < s.peak.size(); ++k)
            if (s.peak[k] > 0) std::printf(" %s %.2f", mem_category_name(MemCategory(k)), double(s.peak[k]) / (1 << 20));
        std::printf("\n");
    }
}
}  // namespace

int bench_grad(const Args& args) {
    bench::GradBenchOptions o;
    o.model = args.str("model", "small");
    o.tokens = args.integer("tokens", o.tokens, 1, int64_t(1) << 24);
    o.cache_length = args.integer("cache_length", o.cache_length, 1, int64_t(1) << 24);
    o.chunk = args.integer("chunk", o.chunk, 1, int64_t(1) << 20);
    o.cache = args.str("cache", o.cache);
    o.mode = args.str("mode", o.mode);
    o.layers_per_cell = args.integer("layers_per_cell", 1, 1, 1024);
    o.repeats = int(args.integer("repeats", 1, 1, 100));
    if (args.flag("quick"))
        o.tokens = std::min<int64_t>(o.tokens, 2048), o.cache_length = std::min<int64_t>(o.cache_length, 512),
        o.chunk = std::min<int64_t>(o.chunk, 128);
    if (o.chunk > o.cache_length || o.cache_length > o.tokens)
        throw UsageError("bench grad: expected --chunk <= --cache_length <= --tokens");
    Progress progress("bench grad");
    const auto r = bench::run_grad_bench(o, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    std::printf("model %s, %s, %s, %lld tokens, cache %lld, chunk %lld: %lld rows x %lld cells\n", r.model.c_str(),
                r.cache.c_str(), r.mode.c_str(), (long long)r.tokens, (long long)o.cache_length, (long long)o.chunk,
                (long long)r.rows, (long long)r.cells);
    std::printf("  forward-only pass      %9.3f s\n", r.forward_s);
    std::printf("  gradient step          %9.3f s (phase 1 %.3f s, phase 2 %.3f s)\n", r.step_s, r.phase1_s, r.phase2_s);
    std::printf("  ratio step / forward   %9.2fx (target <= 4)%s\n", r.ratio(), r.ratio() <= 4.0 ? "" : "  << above target");
    print_memory("forward-only", r.forward_memory);
    print_memory("gradient phase 1", r.phase1_memory);
    print_memory("gradient phase 2", r.phase2_memory);
    std::printf("  checkpoints on host    %9.2f MiB layer inputs, %.2f MiB KV states\n",
                double(r.layer_checkpoint_bytes) / (1 << 20), double(r.kv_checkpoint_bytes) / (1 << 20));
    std::printf("  offload modes move     %9.2f MiB host->device, %.2f MiB device->host per step\n",
                double(r.offload_h2d) / (1 << 20), double(r.offload_d2h) / (1 << 20));
    return 0;
}

}  // namespace kv::cli
