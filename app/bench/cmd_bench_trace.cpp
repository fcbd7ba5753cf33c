// `kvlab bench trace`: the trace view on a synthetic run of ten million spans: model build,
// whole-run summary (target <= 1 s) and frame times while zooming and panning (target p95 <=
// 16 ms). Here the frames are ImGui's CPU work only (no renderer); `xvfb-run kvlab-gui
// --bench-frames --bench-only trace` times the same frames rendered by OpenGL (llvmpipe).
#include <algorithm>
#include <cstdio>

#include "bench/bench_table.h"
#include "bench/ceilings.h"
#include "bench_commands.h"
#include "engine/core/error.h"

#ifdef KVLAB_HAVE_VIEW_BENCH
#include "bench/trace_view_bench.h"
#endif

namespace kv::cli {

int bench_trace(const Args& args) {
#ifdef KVLAB_HAVE_VIEW_BENCH
    views::TraceBenchOptions o;
    o.spans = args.integer("query_rows", o.spans, 1000, 1LL << 34);
    if (args.flag("quick")) o.spans = 200'000, o.frames = 20;
    const views::TraceBenchResult r = views::run_trace_view_bench(o);
    bench::BenchTable t;
    t.title = "Trace view (`kvlab bench trace`)";
    t.measures = "the trace view on a synthetic run: whole-run summary (target <= 1 s) and frame times while zooming and "
                 "panning (target p95 <= 16 ms; ImGui's CPU work, no renderer)";
    t.context = {bench::machine_line(),
                 str("trace view: ", r.spans, " spans on ", r.threads, " threads, ", r.depth, " rows deep; generate ", bench::cell(r.generate_seconds, 2),
                     " s, build model ", bench::cell(r.build_seconds, 2), " s, whole-run summary ", bench::cell(r.summary_seconds, 3),
                     " s (CPU ", bench::cell(r.summary_cpu_seconds, 3), " s), icicle ", bench::cell(r.icicle_seconds, 3), " s")};
    t.columns = {{"scenario (per frame, ms)", true}, {"frames"}, {"wall p50"}, {"wall p95"}, {"wall max"}, {"cpu p95"}, {"vertices"}};
    double worst = 0;
    for (const auto& s : r.scenarios) {
        t.add_row({s.name, std::to_string(s.frames), bench::cell(s.wall_ms_p50, 2), bench::cell(s.wall_ms_p95, 2),
                   bench::cell(s.wall_ms_max, 2), bench::cell(s.cpu_ms_p95, 2), std::to_string(s.max_vertices)});
        worst = std::max(worst, s.wall_ms_p95);
    }
    t.notes = {str("targets: whole-run summary ", bench::cell(r.summary_seconds, 3), " s (<= 1 s) ", r.summary_seconds <= 1.0 ? "met" : "MISSED",
                   "; frame p95 ", bench::cell(worst, 2), " ms (<= 16 ms, CPU side, no renderer) ", worst <= 16.0 ? "met" : "MISSED")};
    emit_bench_table(args, t);
    return 0;
#else
    (void)args;
    throw Error("kvlab bench trace: this build has no views (built without Dear ImGui); expected a build with KVLAB_GUI on");
#endif
}

}  // namespace kv::cli
