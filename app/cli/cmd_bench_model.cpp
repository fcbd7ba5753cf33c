// `kvlab bench model [MODEL]`: prefill and decode tokens/s against this machine's floors.
#include <cstdio>

#include "bench_commands.h"
#include "bench/ceilings.h"
#include "bench/model_bench.h"
#include "progress.h"

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
        const std::string d = args.str("dtype");
        size_t p = 0;
        while (p <= d.size()) {
            size_t q = d.find(',', p);
            if (q == std::string::npos) q = d.size();
            const std::string one = d.substr(p, q - p);
            if (one != "f32" && one != "bf16" && one != "packed")
                throw UsageError("--dtype: '" + one + "' is not f32, bf16 or packed (GGUF blocks kept in memory)");
            opt.dtypes.push_back(one);
            p = q + 1;
        }
    }
    Progress progress("bench model");
    std::vector<bench::ModelBenchMemory> mem;
    auto rows = bench::run_model_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); }, &mem);
    progress.finish();
    std::printf("%s\n", bench::machine_line().c_str());
    std::printf("model %s\n", opt.model.c_str());
    std::printf("%-34s %12s %12s %8s %7s  %s\n", "measurement", "tokens/s", "floor", "ratio", "target", "floor from");
    for (const auto& r : rows)
        std::printf("%-34s %12.1f %12.1f %7.2fx %6.2fx  %s%s\n", r.name.c_str(), r.tokens_per_s, r.floor_tokens_per_s, r.ratio(),
                    r.target, r.floor_basis.c_str(), r.pass() ? "" : "  << below target");
    // Peaks are cumulative over the configurations run so far (the process's VmHWM never falls).
    const double MiB = 1024.0 * 1024.0;
    for (const auto& m : mem)
        std::printf("memory %-6s weights %.1f MiB; tracked peak: weights %.1f MiB, all %.1f MiB; process peak RSS (VmHWM) %.1f MiB\n",
                    m.dtype.c_str(), double(m.weight_bytes) / MiB, double(m.tracked_weights_peak) / MiB, double(m.tracked_peak) / MiB,
                    double(m.rss_peak) / MiB);
    return 0;
}

}  // namespace kv::cli
