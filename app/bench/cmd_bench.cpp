// `kvlab bench` (the kvlab-bench program): dispatch, and `bench ops`: ratios of our ops to this machine's ceilings, measured in one run.
#include <cstdio>

#include "bench_commands.h"
#include "app/cli/commands.h"
#include "bench/cache_bench.h"
#include "bench/ceilings.h"
#include "bench/model_bench.h"
#include "bench/op_bench.h"
#include "engine/core/error.h"
#include "app/cli/progress.h"

namespace kv::cli {

namespace {
std::vector<OptionSpec> bench_options() {
    auto o = global_options();
    o.push_back({"quick", OptKind::FLAG, "", "small shapes and short timings (smoke test)"});
    o.push_back({"min_seconds", OptKind::FLOAT, "0.3", "minimum timing per measurement"});
    o.push_back({"csv", OptKind::STRING, "", "also write the rows to this CSV file"});
    o.push_back({"md", OptKind::STRING, "", "also append the table as a Markdown section to this file (scripts/performance.sh)"});
    o.push_back({"model", OptKind::STRING, "qwen2.5-0.5b", "bench model/cache: model preset, folder or .gguf"});
    o.push_back({"dtype", OptKind::STRING, "f32,bf16", "bench model: precisions to measure"});
    o.push_back({"prefill_tokens", OptKind::INT, "2048", "bench model: prompt length"});
    o.push_back({"decode_context", OptKind::INT, "4096", "bench model: context of the decode steps"});
    o.push_back({"context", OptKind::INT, "32768", "bench cache: sequence length"});
    o.push_back({"cache_length", OptKind::INT, "4096", "bench cache: cache length"});
    o.push_back({"chunk", OptKind::INT, "512", "bench cache: chunk size"});
    o.push_back({"repeats", OptKind::INT, "3", "bench telemetry/grad: repeats (the best counts)"});
    o.push_back({"tokens", OptKind::INT, "16384", "bench grad: sequence length"});
    o.push_back({"cache", OptKind::STRING, "h2o-default", "bench grad: cache policy-buffer"});
    o.push_back({"mode", OptKind::STRING, "lora", "bench grad: lora or full"});
    o.push_back({"layers_per_cell", OptKind::INT, "1", "bench grad: rows of this many layers"});
    o.push_back({"query_rows", OptKind::INT, "10000000", "bench telemetry: rows of the query benchmark session"});
    o.push_back({"dir", OptKind::STRING, "/tmp", "bench telemetry/sweep: where temporary sessions go"});
    o.push_back({"data", OptKind::STRING, "repeat", "bench fidelity/sweep: task (repeat, passkey, recall, needle)"});
    o.push_back({"samples", OptKind::INT, "1", "bench fidelity/sweep: samples per run"});
    o.push_back({"sizes", OptKind::STRING, "64KiB,1MiB,16MiB,64MiB", "bench dist: all-reduce message sizes"});
    o.push_back({"backend", OptKind::STRING, "auto", "bench dist: --dist.backend (auto: mpi under mpirun)"});
    o.push_back({"steps", OptKind::INT, "3", "bench dist: fine-tuning steps timed for the communication share"});
    o.push_back({"page", OptKind::INT, "16", "bench quest: slots per page"});
    o.push_back({"fraction", OptKind::INT, "8", "bench quest: read 1/fraction of the pages"});
    o.push_back({"family", OptKind::STRING, "", "bench families: the families to measure (comma list; default all)"});
    return o;
}

void print_help() {
    std::printf(
        "usage: kvlab bench ops|model|cache|policies|kivi|telemetry|grad|fidelity|sweep|dist|quest|trace|families [options]\n\n"
        "  ops        matmul (f32, bf16) vs raw oneDNN; RMSNorm, RoPE, SwiGLU vs a streaming triad\n"
        "             (targets: matmul >= 0.9x, memory-bound ops >= 0.6x)\n"
        "  model      prefill and decode of a model vs its matmul and bandwidth floors\n"
        "  cache      SDPA weights overhead, policy and buffer chunk throughput, KV bytes per token\n"
        "  policies   eval throughput of every policy vs lastrec on the same run (target >= 0.9x in CPU time);\n"
        "             --model (default smollm2-135m), --tokens (2048), --cache_length (512), --chunk (128),\n"
        "             --repeats (3 interleaved rounds), --cache (comma list; default all that evict), --threads (1)\n"
        "  kivi       decode SDPA over a KIVI-2 buffer, and a decode step of each row format, vs the f32 buffer at 8k and 32k: bytes read and time\n"
        "             (target <= 0.5x at 32k); --model PRESET for its attention shapes (default SmolLM2-135M's)\n"
        "  quest      decode SDPA of Quest reading 1/8 of the pages vs full attention over the same paged cache\n"
        "             at 8k and 32k (target <= 1/3 the time at 32k); --model PRESET, --page (16), --fraction (8)\n"
        "  telemetry  session writer events/s, span cost, GUI queries, tracing overhead on a small h2o run\n"
        "  grad       gradient step vs forward-only pass, peak memory per phase, offload bytes\n"
        "  fidelity   eval_long with --fidelity true vs without (target <= 2x); --model (default smollm2-135m),\n"
        "             --cache, --cache_length (comma lists), --tokens, --chunk, --data, --samples, --repeats\n"
        "  sweep      kvlab sweep over cells vs the same cells as single kvlab eval_long runs (target <= 1.05x)\n"
        "  dist       under mpirun: all-reduce bandwidth (--sizes) and the all-reduce share of a data-parallel\n"
        "             fine-tuning step (--model tiny, --mode lora|full, --tokens, --steps; docs/DISTRIBUTED.md)\n"
        "  families   prefill of each architecture family (Gemma 2/3/3n, SmolLM3, Phi-3, OLMo 2, gpt-oss, DeepSeek-V2, LFM2)\n"
        "             on a Llama preset's shapes vs the Llama (target >= 1/1.2 of its tokens/s); --model (default small),\n"
        "             --tokens (512), --repeats (3), --family (comma list; default all)\n"
        "  trace      the trace view on 10M synthetic spans: model build, whole-run summary (target <= 1 s),\n"
        "             frame p95 while zooming (target <= 16 ms; CPU side here, GL in kvlab-gui --bench-frames\n"
        "             --bench-only trace); --query_rows N spans, --quick 200k\n"
        "Every ratio is measured against its baseline in the same run.\n\n"
        "options:\n%s",
        format_options(bench_options()).c_str());
}

int bench_ops(const Args& args) {
    bench::OpBenchOptions opt;
    opt.quick = args.flag("quick");
    opt.min_seconds = args.real("min_seconds", opt.quick ? 0.05 : 0.3, 0.001, 60);
    Progress progress("bench ops");
    auto rows = bench::run_op_bench(opt, [&](int done, int total, const std::string& what) { progress.update(done, total, what); });
    progress.finish();
    bench::BenchTable t;
    t.title = "Ops vs this machine's ceilings (`kvlab bench ops`)";
    t.measures = "Our matmul against a raw oneDNN matmul of the same shape, memory-bound ops against a streaming triad; "
                 "targets: matmul >= 0.9x, memory-bound ops >= 0.6x.";
    t.context = {bench::machine_line()};
    t.columns = {{"op", true}, {"ours"}, {"ceiling"}, {"ratio"}, {"target"}, {"ceiling measured by", true}, {"", true}};
    int failed = 0;
    for (const auto& r : rows) {
        t.add_row({r.name, bench::cell(r.ours, 1), bench::cell(r.ceiling, 1), bench::cell(r.ratio(), 2) + "x",
                   bench::cell(r.target, 2) + "x", r.ceiling_name, r.pass() ? "" : "<< below target"});
        failed += !r.pass();
    }
    t.notes = {str("units: GFLOP/s for matmul, GB/s for memory-bound ops; ", int(rows.size()) - failed, " of ", rows.size(),
                   " rows meet their target")};
    emit_bench_table(args, t);
    return 0;
}
}  // namespace

int bench_main(int argc, char** argv, int first) {
    Args args(argc, argv, first, bench_options());
    if (args.flag("help")) {
        print_help();
        return 0;
    }
    apply_global_options(args);
    if (args.positional().empty()) throw UsageError("bench: missing what to benchmark; expected: kvlab bench ops|model|cache|policies|kivi|telemetry|grad|fidelity|sweep|dist|quest|trace|families");
    const std::string what = args.positional()[0];
    if (what == "ops") return bench_ops(args);
    if (what == "model") return bench_model(args);
    if (what == "cache") return bench_cache(args);
    if (what == "policies") return bench_policies(args);
    if (what == "kivi") return bench_kivi(args);
    if (what == "telemetry") return bench_telemetry(args);
    if (what == "trace") return bench_trace(args);
    if (what == "grad") return bench_grad(args);
    if (what == "fidelity") return bench_fidelity(args);
    if (what == "sweep") return bench_sweep(args);
    if (what == "dist") return bench_dist(args);
    if (what == "quest") return bench_quest(args);
    if (what == "families") return bench_families(args);
    throw UsageError("bench: unknown benchmark '" + what + "'; expected: ops, model, cache, policies, kivi, telemetry, grad, fidelity, sweep, dist, quest, trace, families");
}

}  // namespace kv::cli
