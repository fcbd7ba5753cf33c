// `kvlab bench quest`: Quest's decode SDPA over 1/8 of the pages vs full attention (bench/quest_bench.h).
#include <cstdio>

#include "bench_commands.h"
#include "bench/quest_bench.h"
#include "engine/core/error.h"
#include "engine/model/presets.h"
#include "progress.h"

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
    std::printf("decode SDPA, %lld heads / %lld KV heads of %lld, one layer; Quest pages of %lld slots, 1/%lld of them read\n",
                (long long)opt.heads, (long long)opt.kv_heads, (long long)opt.head_dim, (long long)opt.page, (long long)opt.fraction);
    std::printf("%-58s %12s %12s %9s %9s\n", "measurement", "a", "b", "a/b", "target");
    for (const auto& r : rows) {
        const std::string tgt = r.target > 0 ? str(r.at_most ? "<= " : ">= ", r.target) : "";
        std::printf("%-58s %12.3f %12.3f %8.3fx %9s  %s%s\n", r.name.c_str(), r.a, r.b, r.ratio, tgt.c_str(), r.unit.c_str(),
                    r.pass() ? "" : "  << misses target");
    }
    return 0;
}

}  // namespace kv::cli
