// `kvlab bench quest`: Quest's decode SDPA over 1/8 of the pages vs full attention (bench/quest_bench.h).
#include <cstdio>

#include "bench_commands.h"
#include "bench/ceilings.h"
#include "bench/quest_bench.h"
#include "engine/core/error.h"
#include "engine/model/presets.h"
#include "app/cli/progress.h"

namespace kv::cli {

int bench_quest(const Args& args) {
    bench::QuestBenchOptions opt;
    if (args.has("model")) {  // a preset's attention shapes
        const ModelConfig c = preset_config(args.str("model"));
        opt.heads = c.num_heads, opt.kv_heads = c.num_kv_heads, opt.head_dim = c.head_dim;
    }
    opt.page = args.integer("page", opt.page, 1, 4096);
    opt.fraction = args.integer("fraction", opt.fraction, 2, 1024);
    opt.min_seconds = args.real("min_seconds", 0.3, 0.001, 60);
    if (args.flag("quick")) opt.contexts = {1024, 4096};
    Progress progress("bench quest");
    auto rows = bench::run_quest_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Quest decode attention (`kvlab bench quest`)";
    t.measures = str("Decode SDPA of Quest reading 1/", opt.fraction, " of the pages vs full attention over the same paged cache; "
                     "target <= 1/3 the time at 32k.");
    t.context = {bench::machine_line(), str("decode SDPA, ", opt.heads, " heads / ", opt.kv_heads, " KV heads of ", opt.head_dim,
                                            ", one layer; Quest pages of ", opt.page, " slots, 1/", opt.fraction, " of them read")};
    bench::fill_ab_table(t, rows);
    emit_bench_table(args, t);
    return 0;
}

}  // namespace kv::cli
