// Frame-time benchmark of the views (for docs/PERFORMANCE.md, target <= 33 ms per frame): a
// synthetic session — an eviction map of 128k tokens x 24 layers (2 KV heads, 4096 slots,
// chunks of 1024, scores every 8th chunk) and a memory timeline of 10M allocator events with
// 1M op spans and cell bands — then timed frames of Canvas refresh + draw + ImGui::Render on
// this thread with the caller's TextureHost (GL under Xvfb in the app, a recorder in tests),
// optionally with a `small` model run writing live. Prints nothing; returns numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "views/canvas.h"

struct ImDrawData;

namespace kv::views {

struct ViewBenchOptions {
    // eviction map dataset
    int64_t tokens = 131072;
    int layers = 24;
    int kv_heads = 2;
    int64_t cache_length = 4096;
    int64_t chunk_size = 1024;
    int score_interval = 8;  // full score arrays every this many chunks
    // memory timeline dataset
    int64_t memory_events = 10'000'000;
    int64_t spans = 1'000'000;
    int cells = 128;
    // frames
    int frames = 30;  // per scenario
    float width = 1600, height = 1000;
    std::string dir = "/tmp";    // where the temporary session goes (deleted afterwards)
    std::string session;         // use this existing bench session instead of writing one
    bool keep_session = false;
    // Only the scenario groups whose name contains this ("eviction", "memory", "cell grid",
    // "scores", "metrics"; "" = all). The live run is governed by live_run alone.
    std::string only;
    bool live_run = true;        // also time frames while a `small` eval run writes
    int64_t live_seq_length = 8192;
    // Host hooks around each frame when the caller renders (GL): called right before
    // ImGui::NewFrame() and right after ImGui::Render() with its draw data.
    std::function<void()> before_frame;
    std::function<void(ImDrawData*)> after_frame;
};

struct ViewBenchScenario {
    std::string name;
    int frames = 0;
    double cpu_ms_mean = 0, cpu_ms_p50 = 0, cpu_ms_max = 0;    // this thread's CPU time per frame
    double wall_ms_mean = 0, wall_ms_p50 = 0, wall_ms_max = 0;  // wall time per frame
    double first_frame_ms = 0;  // wall time of the first frame (texture builds, first reads)
};

// Reading a view's data from the session: refreshes (each within the view's time budget)
// until nothing new arrives.
struct ViewBenchLoad {
    std::string view;
    double seconds = 0;
    int refreshes = 0;
    double max_refresh_ms = 0;  // longest single refresh (what one frame can stall)
};

struct ViewBenchResult {
    std::string session;
    double write_seconds = 0;          // writing the synthetic session
    int64_t memory_events = 0, spans = 0, cache_steps = 0;
    double memory_load_seconds = 0;    // refreshes until the memory timeline caught up
    int memory_load_refreshes = 0;
    double memory_load_max_refresh_ms = 0;  // longest single refresh while loading
    double eviction_load_ms = 0;       // first refresh of the eviction map (all cache steps)
    std::vector<ViewBenchLoad> loads;  // every view's first full read
    int64_t texture_uploads = 0;
    std::vector<ViewBenchScenario> scenarios;
    std::string live_error;            // why the live scenario did not run ("" = it ran)
};

// Writes the synthetic session described by `o` to `path` (must not exist). Returns the run id.
int64_t write_view_bench_session(const std::string& path, const ViewBenchOptions& o);

// Uses the current ImGui context when there is one (its font atlas must be built; the host's
// renderer hooks go in before_frame/after_frame); otherwise creates and destroys its own.
ViewBenchResult run_view_bench(TextureHost& host, const ViewBenchOptions& o = {});
// The result as an aligned text table.
std::string format_view_bench(const ViewBenchResult& r);

}  // namespace kv::views
