// `kvlab bench trace`: the trace view on a synthetic run of ten million spans: model build,
// whole-run summary (target <= 1 s) and frame times while zooming and panning (target p95 <=
// 16 ms). Here the frames are ImGui's CPU work only (no renderer); `xvfb-run kvlab-gui
// --bench-frames --bench-only trace` times the same frames rendered by OpenGL (llvmpipe).
#include "bench/bench_table.h"
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
    emit_bench_table(args, views::trace_bench_table(r, ""));
    return 0;
#else
    (void)args;
    throw Error("kvlab bench trace: this build has no views (built without Dear ImGui); expected a build with KVLAB_GUI on");
#endif
}

}  // namespace kv::cli
