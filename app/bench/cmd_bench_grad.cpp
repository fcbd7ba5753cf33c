// `kvlab bench grad`: gradient step vs forward-only pass, peak memory per phase, offload bytes.
#include <cstdio>

#include "bench_commands.h"
#include "bench/grad_bench.h"
#include "engine/core/error.h"
#include "app/cli/progress.h"

namespace kv::cli {

namespace {
void memory_rows(bench::BenchTable& t, const char* what, const std::vector<DeviceMemoryStats>& stats) {
    for (const auto& s : stats) {
        std::string parts;
        for (size_t k = 0; k < s.peak.size(); ++k)
            if (s.peak[k] > 0) parts += str(parts.empty() ? "" : ", ", mem_category_name(MemCategory(k)), " ", bench::cell(double(s.peak[k]) / (1 << 20), 2));
        t.add_row({str("peak memory, ", what), bench::cell(double(s.peak_total) / (1 << 20), 2), "MiB", parts});
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
    bench::BenchTable t;
    t.title = "Gradient step (`kvlab bench grad`)";
    t.measures = "A gradient step (both phases) vs a forward-only pass over the same sequence and cache; target <= 4x. "
                 "Peak memory per phase, checkpoint and offload bytes.";
    t.context = {str("model ", r.model, ", ", r.cache, ", ", r.mode, ", ", r.tokens, " tokens, cache ", o.cache_length, ", chunk ", o.chunk,
                     ": ", r.rows, " rows x ", r.cells, " cells")};
    t.columns = {{"measurement", true}, {"value"}, {"unit", true}, {"detail", true}};
    t.add_row({"forward-only pass", bench::cell(r.forward_s, 3), "s", ""});
    t.add_row({"gradient step", bench::cell(r.step_s, 3), "s", str("phase 1 ", bench::cell(r.phase1_s, 3), " s, phase 2 ", bench::cell(r.phase2_s, 3), " s")});
    t.add_row({"ratio step / forward", bench::cell(r.ratio(), 2), "x", str("target <= 4", r.ratio() <= 4.0 ? "" : "  << above target")});
    memory_rows(t, "forward-only", r.forward_memory);
    memory_rows(t, "gradient phase 1", r.phase1_memory);
    memory_rows(t, "gradient phase 2", r.phase2_memory);
    t.add_row({"checkpoints on host", bench::cell(double(r.layer_checkpoint_bytes) / (1 << 20), 2), "MiB",
               str("layer inputs; ", bench::cell(double(r.kv_checkpoint_bytes) / (1 << 20), 2), " MiB KV states")});
    t.add_row({"offload modes move", bench::cell(double(r.offload_h2d) / (1 << 20), 2), "MiB",
               str("host->device per step; ", bench::cell(double(r.offload_d2h) / (1 << 20), 2), " MiB device->host")});
    emit_bench_table(args, t);
    return 0;
}

}  // namespace kv::cli
