// Trace view: where a run's time went. One lane per thread with its spans nested by depth
// (run > phase > cell > layer > chunk > op), GPU lanes per device and stream whose kernels name
// the span that launched them (CUPTI correlation: a click on a kernel outlines its launching
// span with an arrow, a click on a span its kernels; the icicle can show device time by launch
// path), time inside the run that no phase covers drawn
// hatched as unattributed, zoom (wheel) and pan (drag) with merged levels of detail, a range
// selected by right-drag with its statistics (the span summary of that range; for GPU runs the
// device's busy share, the launch delays and each kernel under the span that launched it), span search with
// a duration histogram, an icicle (aggregated flame graph) and a legend that toggles categories.
// The model (views/trace_model.h) is rebuilt from the reader's rows in refresh; drawing reads it only.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/span_summary.h"
#include "views/canvas.h"
#include "views/plot_util.h"
#include "views/trace_gpu_summary.h"
#include "views/trace_model.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

enum class TracePanel : uint8_t { RANGE = 0, SEARCH, ICICLE };

struct TraceViewState {
    int64_t run = 0;
    int64_t t0_ns = 0;  // the run's start (axis origin)
    // ---- what the reader gave, and the model built from it ----
    std::vector<TraceSpan> raw;
    std::vector<std::string> names;
    std::unordered_map<std::string, uint32_t> name_ids;
    int64_t last_span_id = 0;
    bool model_stale = false;
    std::chrono::steady_clock::time_point built_at{};
    TraceModel model;
    storage::SpanSummary whole;  // the whole run's summary (rebuilt with the model)
    GpuSummary gpu_whole;        // GPU runs: busy share, launch delays, work per launching span
    std::unordered_map<std::string, int64_t> gpu_launched_whole;  // device time per launching span name
    Icicle icicle;               // built with the model
    Icicle gpu_icicle;           // GPU runs: device time under the launching spans' paths
    uint64_t version = 0;        // bumps when the model is rebuilt
    // ---- interaction (host/tests may set) ----
    AxisRange time{0, 1};  // visible window, ns relative to t0_ns
    bool follow = true;    // fit the window to the data
    uint32_t hidden_categories = 0;  // span_legend.h mask
    TracePanel panel = TracePanel::RANGE;        // the panel to show (set it to switch)
    TracePanel drawn_panel = TracePanel::RANGE;  // the panel the last frame showed
    bool icicle_gpu = false;               // the icicle shows device time by launch path
    uint32_t selected = kNoParent;         // a clicked span (model index); rebuilding clears it
    size_t drawn_links = 0;                // launch arrows the last frame drew (tests)
    bool has_selection = false;
    int64_t sel_t0 = 0, sel_t1 = 0;  // absolute engine ns
    storage::SpanSummary selection;  // summary of [sel_t0, sel_t1)
    GpuSummary gpu_selection;        // its GPU work
    std::unordered_map<std::string, int64_t> gpu_launched_selection;
    Icicle range_icicle, range_gpu_icicle;  // the icicles of [sel_t0, sel_t1): what the icicle panel shows while a range is selected
    float drag_from_x = -1;          // screen x where a right-drag began
    float scroll_y = 0;              // lanes scrolled up by this many pixels (shift+wheel)
    char search_text[96] = {0};
    SpanSearch search;
    int search_bin = -1;                       // the histogram bar clicked (-1: none): the list shows its spans
    std::vector<uint32_t> search_bin_matches;  // those spans, longest first
    std::string error;
    double rebuild_interval_s = 1.0;  // a live run's model is rebuilt at most this often
    double refresh_budget_ms = 30;    // reading stops after this long (a frame's share); the rest next refresh
    bool caught_up = false;           // the last refresh read every span there was
};

// Reads spans newer than the state holds (pages within refresh_budget_ms) and, once caught up,
// rebuilds the model (at most every rebuild_interval_s while spans keep arriving). True when
// the model changed or more spans wait to be read.
bool refresh_trace_view(TraceViewState& s, storage::SessionReader& reader);
// Replaces the model directly (benchmarks, tests): as refresh does after reading.
void set_trace_model(TraceViewState& s, TraceModel model);
// Selects [t0, t1) (absolute ns) and computes its summaries: host spans, GPU work and both icicles.
void select_trace_range(TraceViewState& s, int64_t t0, int64_t t1);
// Selects the spans of histogram bin `bin` of the current search (-1: none), as a click on its bar does.
void select_search_bin(TraceViewState& s, int bin);
// Selects span `i` (kNoParent: none), as a click does: it and the spans linked to it by a
// launch (its launcher, or the GPU records it launched) are outlined with an arrow per launch.
void select_trace_span(TraceViewState& s, uint32_t i);
// Draws from the state only.
void DrawTraceView(TraceViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry trace_view_entry();

}  // namespace kv::views
