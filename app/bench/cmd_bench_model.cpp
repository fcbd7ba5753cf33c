// `kvlab bench model [MODEL]`: prefill and decode tokens/s against this machine's floors.
#include <cstdio>

#include "bench_commands.h"
#include "bench/ceilings.h"
#include "bench/model_bench.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "app/cli/progress.h"

namespace kv::cli {

int bench_model(const Args& args) {
    bench::ModelBenchOptions opt;
    if (args.positional().size() > 1) opt.model = args.positional()[1];
    opt.model = args.str("model", opt.model);
    opt.prefill_tokens = args.integer("prefill_tokens", opt.prefill_tokens, 1, 1 << 20);
    opt.decode_context = args.integer("decode_context", opt.decode_context, 1, 1 << 22);
    opt.min_seconds = args.real("min_seconds", 0.3, 0.001, 60);
    if (bench::is_gguf_model(opt.model)) opt.dtypes.push_back("packed");
    if (args.has("dtype")) {
        opt.dtypes.clear();
        for (const std::string& one : split(args.str("dtype"))) {
            if (one != "f32" && one != "bf16" && one != "packed")
                throw UsageError("--dtype: '" + one + "' is not f32, bf16 or packed (GGUF blocks kept in memory)");
            opt.dtypes.push_back(one);
        }
    }
    Progress progress("bench model");
    std::vector<bench::ModelBenchMemory> mem;
    auto rows = bench::run_model_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); }, &mem);
    progress.finish();
    bench::BenchTable t;
    t.title = "Model prefill and decode: " + opt.model + " (`kvlab bench model`)";
    t.measures = "Prefill and decode tokens/s of a model against the floors its matmuls (raw oneDNN) and its weight and KV "
                 "bytes (streaming triad) allow on this machine; the ratio is ours / floor.";
    t.context = {bench::machine_line(), "model " + opt.model};
    t.columns = {{"measurement", true}, {"tokens/s"}, {"floor"}, {"ratio"}, {"target"}, {"floor from", true}, {"", true}};
    for (const auto& r : rows)
        t.add_row({r.name, bench::cell(r.tokens_per_s, 1), bench::cell(r.floor_tokens_per_s, 1), bench::cell(r.ratio(), 2) + "x",
                   bench::cell(r.target, 2) + "x", r.floor_basis, r.pass() ? "" : "<< below target"});
    // Peaks are cumulative over the configurations run so far (the process's VmHWM never falls).
    const double MiB = 1024.0 * 1024.0;
    for (const auto& m : mem)
        t.notes.push_back(str("memory ", m.dtype, ": weights ", bench::cell(double(m.weight_bytes) / MiB, 1), " MiB; tracked peak: weights ",
                              bench::cell(double(m.tracked_weights_peak) / MiB, 1), " MiB, all ", bench::cell(double(m.tracked_peak) / MiB, 1),
                              " MiB; process peak RSS (VmHWM) ", bench::cell(double(m.rss_peak) / MiB, 1), " MiB"));
    emit_bench_table(args, t);
    return 0;
}

}  // namespace kv::cli
