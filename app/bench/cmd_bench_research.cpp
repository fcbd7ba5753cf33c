// `kvlab bench fidelity` and `kvlab bench sweep`: the research loop's cost ratios (bench/research_bench.h).
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "bench_commands.h"
#include "bench/ceilings.h"
#include "bench/research_bench.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "app/cli/progress.h"

namespace kv::cli {

namespace {

// The non-empty items of a list option.
std::vector<std::string> split_commas(const std::string& s) {
    std::vector<std::string> out;
    for (std::string& one : split(s))
        if (!one.empty()) out.push_back(std::move(one));
    return out;
}

bench::ResearchBenchOptions research_options(const Args& args) {
    bench::ResearchBenchOptions opt;
    // The model options' default (qwen2.5-0.5b) is the other benches'; these default to the
    // model the demo and docs/RESULTS.md use.
    if (args.positional().size() > 1) opt.model = args.positional()[1];
    opt.model = args.str("model", opt.model);
    opt.data = args.str("data", opt.data);
    if (opt.data != "repeat" && opt.data != "passkey" && opt.data != "recall" && opt.data != "needle")
        throw UsageError("--data: '" + opt.data + "' needs no file to bench; expected repeat, passkey, recall or needle");
    opt.seq_length = args.integer("tokens", opt.seq_length, 16, 1 << 20);
    opt.num_samples = args.integer("samples", opt.num_samples, 1, 1000);
    opt.chunk = args.integer("chunk", opt.chunk, 1, 1 << 20);
    opt.repeats = int(args.integer("repeats", opt.repeats, 1, 100));
    opt.dir = args.str("dir", opt.dir);
    if (args.has("cache")) opt.caches = split_commas(args.str("cache"));
    if (args.has("cache_length")) {
        opt.cache_lengths.clear();
        for (const std::string& s : split_commas(args.str("cache_length"))) {
            char* end = nullptr;
            const long long v = std::strtoll(s.c_str(), &end, 10);
            if (!end || *end || v < opt.chunk)
                throw UsageError("--cache_length: '" + s + "' is not a cache length; expected integers >= --chunk (" +
                                 std::to_string(opt.chunk) + "), comma-separated");
            opt.cache_lengths.push_back(v);
        }
    }
    if (opt.caches.empty() || opt.cache_lengths.empty()) throw UsageError("--cache / --cache_length: expected at least one value");
    return opt;
}

int print_rows(const Args& args, bench::BenchTable t, const std::vector<bench::ResearchBenchRow>& rows,
               const bench::ResearchBenchOptions& opt) {
    t.context = {bench::machine_line(), str("model ", opt.model, ", best of ", opt.repeats)};
    t.columns = {{"measurement", true}, {"with s"}, {"without s"}, {"ratio"}, {"target"}, {"", true}};
    for (const auto& r : rows)
        t.add_row({r.name, bench::cell(r.with, 2), bench::cell(r.without, 2), bench::cell(r.ratio(), 3) + "x",
                   "<= " + bench::cell(r.target, 2) + "x", r.pass() ? "" : "<< above target"});
    emit_bench_table(args, t);
    return 0;
}

}  // namespace

int bench_fidelity(const Args& args) {
    const bench::ResearchBenchOptions opt = research_options(args);
    Progress progress("bench fidelity");
    auto rows = bench::run_fidelity_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Fidelity tracking (`kvlab bench fidelity`)";
    t.measures = "eval_long with --fidelity true (full attention over a K/V shadow per layer and chunk) vs the same run without; "
                 "target <= 2x.";
    return print_rows(args, t, rows, opt);
}

int bench_sweep(const Args& args) {
    bench::ResearchBenchOptions opt = research_options(args);
    if (!args.has("cache")) opt.caches = {"h2o-default", "lastrec-default"};
    // The kvlab beside this kvlab-bench (both are built and installed into one folder).
    opt.kvlab = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvlab").string();
    Progress progress("bench sweep");
    auto rows = bench::run_sweep_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Sweep (`kvlab bench sweep`)";
    t.measures = "kvlab sweep over cells (one process, one session) vs the same cells as single kvlab eval_long processes; "
                 "target <= 1.05x.";
    return print_rows(args, t, rows, opt);
}

}  // namespace kv::cli
