// The trace view at scale: a synthetic run of ten million spans (a nested run > phase > cell >
// layer > chunk > op thread and worker threads of ops), built into the view's model in memory
// (no session file: reading 10M rows back is the storage bench's business), then the
// whole-run summary timed and frames of DrawTraceView + ImGui::Render timed while zooming and
// panning, with the host's renderer hooks (GL under Xvfb in kvlab-gui --bench-frames).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_table.h"

struct ImDrawData;

namespace kv::views {

struct TraceBenchOptions {
    int64_t spans = 10'000'000;
    int frames = 60;  // per scenario
    float width = 1600, height = 1000;
    std::function<void()> before_frame;
    std::function<void(ImDrawData*)> after_frame;
};

struct TraceBenchScenario {
    std::string name;
    int frames = 0;
    double wall_ms_p50 = 0, wall_ms_p95 = 0, wall_ms_max = 0;
    double cpu_ms_p95 = 0;          // the drawing thread (with LP_NUM_THREADS=0, llvmpipe rasterizes on it)
    double process_cpu_ms_p95 = 0;  // every thread (llvmpipe's rasterizers too): the frame's cost to the machine
    int64_t max_vertices = 0;  // most vertices one frame drew (proves the frames drew)
    // Most pixels one frame's triangles cover, overdraw counted (a software rasterizer's cost
    // grows with it: llvmpipe shades and blends every covered pixel).
    double max_pixels = 0;
    int64_t max_commands = 0;  // most draw commands one frame issued (each a draw call for the GL backend)
};

struct TraceBenchResult {
    int64_t spans = 0;
    int threads = 0, depth = 0;
    double generate_seconds = 0;  // synthetic spans
    double build_seconds = 0;     // build_trace_model: sort, nesting, rows, levels
    double summary_seconds = 0;   // whole-run trace_range_summary (wall)
    double summary_cpu_seconds = 0;  // the same in this thread's CPU time (the machine may be shared)
    double icicle_seconds = 0;    // build_icicle
    std::vector<TraceBenchScenario> scenarios;
};

// Uses the current ImGui context (font atlas built) or makes its own.
TraceBenchResult run_trace_view_bench(const TraceBenchOptions& o = {});
// The result as a bench table (console text, --md section): `renderer` names what drew the frames
// ("" = none: ImGui's CPU work only, as `kvlab bench trace` measures; else the GL renderer the
// frames were finished on, as `kvlab-gui --bench-frames --bench-only trace` measures).
bench::BenchTable trace_bench_table(const TraceBenchResult& r, const std::string& renderer);

}  // namespace kv::views
