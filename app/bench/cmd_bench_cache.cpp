// `kvlab bench cache`: SDPA weights overhead, policy and buffer chunk throughput, KV bytes.
#include <cstdio>

#include "bench_commands.h"
#include "bench/cache_bench.h"
#include "bench/ceilings.h"
#include "bench/policy_bench.h"
#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "engine/model/presets.h"
#include "app/cli/progress.h"

namespace kv::cli {

int bench_cache(const Args& args) {
    bench::CacheBenchOptions opt;
    opt.model = args.str("model", opt.model);
    opt.context = args.integer("context", opt.context, 1, 1 << 24);
    opt.cache_length = args.integer("cache_length", opt.cache_length, 1, 1 << 24);
    opt.chunk = args.integer("chunk", opt.chunk, 1, 1 << 20);
    opt.min_seconds = args.real("min_seconds", 0.3, 0.001, 60);
    if (opt.chunk > opt.cache_length || opt.cache_length > opt.context)
        throw UsageError("bench cache: expected --chunk <= --cache_length <= --context");
    Progress progress("bench cache");
    auto rows = bench::run_cache_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Cache: attention weights, policies, buffers, KV bytes (`kvlab bench cache`)";
    t.measures = "Each row is a ratio a/b of two measurements taken in the same run (SDPA with weights vs without, a policy's "
                 "or buffer's chunk throughput vs the default's, KV bytes per token); a target where the row has one.";
    t.context = {bench::machine_line(), str("model ", opt.model, ", context ", opt.context, ", cache ", opt.cache_length, ", chunk ", opt.chunk)};
    bench::fill_ab_table(t, rows);
    emit_bench_table(args, t);
    return 0;
}

// `kvlab bench policies`: every policy's eval throughput relative to lastrec, in process CPU
// time with one kernel thread unless --threads says otherwise (bench/policy_bench.h).
int bench_policies(const Args& args) {
    bench::PolicyBenchOptions opt;
    if (args.has("model")) opt.model = args.str("model");  // the option table's default is the other benches'
    opt.tokens = args.integer("tokens", opt.tokens, 2, 1 << 24);
    opt.cache_length = args.integer("cache_length", opt.cache_length, 1, 1 << 24);
    opt.chunk = args.integer("chunk", opt.chunk, 1, 1 << 20);
    opt.repeats = int(args.integer("repeats", opt.repeats, 1, 100));
    if (args.has("cache")) {
        for (std::string& one : split(args.str("cache")))
            if (!one.empty()) opt.policies.push_back(std::move(one));
    }
    if (opt.chunk > opt.cache_length || opt.cache_length >= opt.tokens)
        throw UsageError("bench policies: expected --chunk <= --cache_length < --tokens (the cache must evict)");
    // One kernel thread: the process CPU time of a run is then its work, whatever the load.
    if (!args.has("threads")) set_num_threads(1);
    Progress progress("bench policies");
    const bench::PolicyBenchResult res =
        bench::run_policy_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    std::fputs(bench::format_policy_load(res).c_str(), stdout);
    emit_bench_table(args, bench::policy_bench_table(res));
    std::fputs(bench::format_policy_rounds(res).c_str(), stdout);
    return 0;
}

// `kvlab bench kivi`: decode SDPA over a KIVI buffer vs the default buffer (bench/cache_bench.h).
int bench_kivi(const Args& args) {
    bench::KiviBenchOptions opt;
    if (args.has("model")) {  // a preset's attention shapes
        const ModelConfig c = preset_config(args.str("model"));
        opt.heads = c.num_heads, opt.kv_heads = c.num_kv_heads, opt.head_dim = c.head_dim;
    }
    opt.min_seconds = args.real("min_seconds", 0.3, 0.001, 60);
    opt.rounds = int(args.integer("repeats", opt.rounds, 1, 100));
    if (args.flag("quick")) opt.contexts = {1024, 4096};
    Progress progress("bench kivi");
    auto rows = bench::run_kivi_bench(opt, [&](int d, int t, const std::string& w) { progress.update(d, t, w); });
    progress.finish();
    bench::BenchTable t;
    t.title = "KIVI decode attention (`kvlab bench kivi`)";
    t.measures = "Decode SDPA over a KIVI-2 buffer vs the f32 buffer at the same context: bytes read and time; target <= 0.5x "
                 "the f32 time at 32k (on the median of the per-round ratios). Row formats (q8 ... turboquant): a decode step of one of two layers (write one token, attend) vs "
                 "SDPA over f32; fp8, nvfp4, mxfp4 and turboquant attend over their codes (target <= 1.25x the time at the "
                 "shortest context), the others share the dequantized working buffer (write back the other layer, dequantize "
                 "this one, SDPA over the f32 copy).";
    t.context = {bench::machine_line(), str("decode SDPA, ", opt.heads, " heads / ", opt.kv_heads, " KV heads of ", opt.head_dim,
                                            ", one layer; kivi", opt.bits, " group ", opt.group, ", residual ", opt.residual)};
    bench::fill_kivi_table(t, rows);
    emit_bench_table(args, t);
    return 0;
}

}  // namespace kv::cli
