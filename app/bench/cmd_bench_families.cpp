// `kvlab bench families`: each architecture family's forward vs a Llama of the same shapes.
#include "bench/ceilings.h"
#include "bench/family_bench.h"
#include "bench_commands.h"
#include "app/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "app/cli/progress.h"

namespace kv::cli {

int bench_families(const Args& args) {
    bench::FamilyBenchOptions opt;
    if (args.has("model")) opt.model = args.str("model");
    if (args.has("tokens")) opt.tokens = args.integer("tokens", opt.tokens, 1, 1 << 20);
    if (args.has("repeats")) opt.repeats = int(args.integer("repeats", opt.repeats, 1, 100));
    if (args.has("family")) opt.families = split(args.str("family"));
    if (args.flag("quick")) opt.model = "tiny", opt.tokens = 64, opt.repeats = 1;
    Progress progress("bench families");
    auto rows = bench::run_family_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Architecture families vs Llama (`kvlab bench families`)";
    t.measures = str("Prefill tokens/s of each family on ", opt.model, "'s shapes vs a Llama of the same active parameter count (",
                     opt.model, " with its MLP width moved to match; the lookup tables and a mixture's idle experts not counted), best of ",
                     opt.repeats, " interleaved rounds; target >= 1/1.2 of that Llama's speed. Where that Llama is not ", opt.model,
                     " itself, a second row compares with ", opt.model, " (no target).");
    t.context = {bench::machine_line(), str("one prefill of ", opt.tokens, " tokens, f32, random weights")};
    bench::fill_ab_table(t, rows);
    emit_bench_table(args, t);
    return 0;
}

}  // namespace kv::cli
