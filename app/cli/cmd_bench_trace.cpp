// `kvlab bench trace`: the trace view on a synthetic run of ten million spans: model build,
// whole-run summary (target <= 1 s) and frame times while zooming and panning (target p95 <=
// 16 ms). Here the frames are ImGui's CPU work only (no renderer); `xvfb-run kvlab-gui
// --bench-frames --bench-only trace` times the same frames rendered by OpenGL (llvmpipe).
#include <algorithm>
#include <cstdio>

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
    std::printf("%s\n", bench::machine_line().c_str());
    std::printf("%s", views::format_trace_bench(r).c_str());
    double worst = 0;
    for (const auto& s : r.scenarios) worst = std::max(worst, s.wall_ms_p95);
    std::printf("targets: whole-run summary %.3f s (<= 1 s) %s; frame p95 %.2f ms (<= 16 ms, CPU side, no renderer) %s\n",
                r.summary_seconds, r.summary_seconds <= 1.0 ? "met" : "MISSED", worst, worst <= 16.0 ? "met" : "MISSED");
    return 0;
#else
    (void)args;
    throw Error("kvlab bench trace: this build has no views (built without Dear ImGui); expected a build with KVLAB_GUI on");
#endif
}

}  // namespace kv::cli
