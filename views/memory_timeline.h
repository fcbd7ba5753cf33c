// Memory timeline: bytes held per category over time as stacked areas (per device), the run's
// op spans in lanes below, and cell boundaries as bands — the "cell pyramids" of the backward
// pass; hover names the allocations around the cursor, click on a band zooms to that cell.
// Built incrementally from memory_events / spans / cells rows (reading only ids above the
// cursors, within a time budget per refresh). Exposes the peak it shows for tests and exports.
//
// Index
//   [SECTION] memory series (raw events and decimation blocks)
//   [SECTION] span lanes
//   [SECTION] view state, refresh, draw
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "views/canvas.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// =========================================================================================
// [SECTION] memory series
// =========================================================================================
// One device's events. Every event lands in a decimation block (kMemoryBlockEvents consecutive
// events: time extent, min/max/last total, category split at the max); the events themselves
// are kept too while the device has at most `raw_limit` of them, which makes any zoom level
// exact. Beyond that the overview comes from the blocks and zoomed windows from the reader.
constexpr int kMemoryBlockEvents = 64;

struct MemoryPoint {  // one event, compact
    int64_t t_ns = 0;
    int64_t device_total = 0;
    int64_t category_total = 0;
    int64_t id = 0;
    uint8_t category = 0;
    int64_t instrumentation_total = 0;  // of device_total, bytes that measure the run (fidelity)
};

struct MemoryBlock {
    int64_t t_first = 0, t_last = 0;
    int64_t first_id = 0;  // id of its first event
    int32_t events = 0;
    int64_t total_min = 0, total_max = 0, total_last = 0;
    int64_t own_max = 0, own_last = 0;  // the same without instrumentation
    std::array<int64_t, kNumMemCategories> at_max{};  // per-category bytes when the total peaked
    // State just before its first event, so a reader query from t_first on can be bucketed exactly.
    int64_t total_before = 0;
    std::array<int64_t, kNumMemCategories> before{};
};

struct MemorySeries {
    int device = -1;
    int64_t events = 0;
    int64_t peak = 0, peak_t_ns = 0;                    // highest device total and when
    std::array<int64_t, kNumMemCategories> at_peak{};   // category split at the peak
    std::array<int64_t, kNumMemCategories> current{};   // category totals after the newest event
    std::array<int64_t, kNumMemCategories> category_peak{};  // highest total of each category
    int64_t total = 0;                                  // device total after the newest event
    // Instrumentation bytes (events flagged ALLOC_FLAGS_INSTRUMENTATION: fidelity's shadow cache and
    // passes) after the newest event, and the highest total without them: the run's own peak.
    int64_t instrumentation = 0, own_peak = 0;
    int64_t t_min = 0, t_max = 0;
    std::vector<MemoryBlock> blocks;
    // Running maxima of blocks[0..i].t_first / .t_last: blocks arrive nearly in time order, so a
    // binary search finds the first block that can reach a time (every block before it is
    // entirely earlier) without walking 150k blocks per frame.
    std::vector<int64_t> t_first_prefix_max, t_last_prefix_max;
    std::vector<MemoryPoint> raw;  // (t, id) order; emptied once events exceed raw_limit
    bool raw_complete = true;      // raw holds every event of the device
    size_t raw_limit = size_t(1) << 19;

    void add(const storage::MemoryEventRow& e);
};

// Buckets over [t0, t1) with the reader's semantics (storage::SessionReader::memory_timeline:
// min/max/last total per bucket, category split at the bucket's max, empty buckets carry the
// previous total). Exact from raw events; from blocks (a block counts in the bucket of its
// first event) when raw was dropped.
std::vector<storage::MemoryBucket> memory_series_buckets(const MemorySeries& s, int64_t t0, int64_t t1, int n);
// Merges finer buckets into `n` buckets over [t0, t1) (max of maxima, split at the max).
std::vector<storage::MemoryBucket> merge_memory_buckets(const std::vector<storage::MemoryBucket>& fine, int64_t t0,
                                                        int64_t t1, int n);
// Buckets of time-ordered events (as raw mode), starting from a known state (category totals and
// device total just before the first point). Points before t0 only advance the state.
std::vector<storage::MemoryBucket> bucket_memory_points(const std::vector<MemoryPoint>& points,
                                                        const std::array<int64_t, kNumMemCategories>& cat_before,
                                                        int64_t total_before, int64_t t0, int64_t t1, int n);

// =========================================================================================
// [SECTION] span lanes
// =========================================================================================
struct SpanBox {
    int64_t start_ns = 0, end_ns = 0;
    int64_t id = 0;
    uint32_t name = 0;  // index into MemoryTimelineViewState::span_names
    int32_t layer = -1, chunk = -1;
    int32_t thread = 0;
};
// One lane per span category, spans sorted by start; a block index (every 256 spans: earliest
// start, latest end) lets zoomed-out frames draw a block as one box instead of its spans.
struct SpanLane {
    trace::SpanCategory category = trace::SpanCategory::OTHER;
    std::vector<SpanBox> spans;
    std::vector<std::pair<int64_t, int64_t>> blocks;  // (min start, max end) per 256 spans
    int64_t max_duration = 0;
    void add(const SpanBox& b);
    // Spans overlapping [t0, t1): index range into `spans` to scan (may include a few that do not).
    std::pair<size_t, size_t> overlapping(int64_t t0, int64_t t1) const;
};

// A cell band: the gradient pipeline's cells (cells table) or the forward's CELL spans.
struct CellBand {
    int32_t row = -1, col = -1;
    int64_t start_ns = 0, end_ns = 0;
    int64_t peak_bytes = -1;  // from the cells table (-1: not recorded)
    // Row of the band strip: overlapping cells (the forward's CELL spans and the backward's
    // cells) go to different rows so neither covers the other's label.
    int32_t slot = 0;
};
// Assigns each band (sorted by start) the first row whose last band ended by its start;
// returns the number of rows used (1 when none overlap).
int assign_cell_slots(std::vector<CellBand>& cells);

// =========================================================================================
// [SECTION] view state, refresh, draw
// =========================================================================================
struct MemoryTimelineViewState {
    int64_t run = 0;
    // ---- selection (host/tests may set) ----
    int device = -2;  // -2: the device with the highest peak; else trace::device_code
    AxisRange time{0, 1};  // visible window, ns relative to the run's t0
    bool follow = true;    // fit the window to the data as it grows
    bool show_spans = true, show_cells = true;
    uint32_t hidden_span_categories = 0;  // span_legend.h mask: lanes of these categories are not drawn
    double refresh_budget_ms = 20;   // reading stops after this long per refresh (resumes next time)
    size_t rows_per_read = 8192;
    // Zoomed windows of huge runs read their events from the reader when the (padded) window
    // holds at most this many (~30 ms at ~1.3M rows/s); wider windows draw from the blocks.
    int zoom_query_max_events = 40000;

    // ---- ranks of a data-parallel run (storage/rank_runs.h) ----
    // Filled by the first refresh from `run`: the run id of each rank (index = rank; 0 = that
    // rank's telemetry is missing). With more than one the toolbar shows a rank selector;
    // select_memory_rank switches `run` to that rank's run (memory and spans reload).
    std::vector<int64_t> rank_runs;
    int rank = 0;
    int64_t base_run = 0;      // the run whose ranks these are (rank 0's run)
    bool ranks_known = false;
    bool reload_requested = false;  // a rank was picked: the next refresh reads its rows

    // ---- derived data ----
    int64_t t0_ns = 0;  // run start on the engine clock (times are drawn relative to it)
    bool have_t0 = false;
    std::map<int, MemorySeries> series;  // by device
    int64_t last_memory_id = 0, last_span_id = 0, last_cell_id = 0;
    bool caught_up = false;  // the last refresh reached the newest rows
    int64_t memory_rows_total = -1;  // from count_rows at the first refresh (progress while loading)
    std::vector<SpanLane> lanes;  // by category present
    std::vector<std::string> span_names;
    std::map<std::string, uint32_t> span_name_ids;
    std::vector<CellBand> cells;  // by start time
    int cell_slots = 1;           // rows of the cell strip (assign_cell_slots)
    uint64_t version = 0;

    // What the last draw showed (tests compare these with the raw events).
    bool shown_rank_selector = false;
    std::vector<storage::MemoryBucket> shown_buckets;
    int64_t shown_peak = 0;  // max total over the shown buckets
    int shown_device = -1;
    // Key of shown_buckets: recomputed only when the window, width, device or data change.
    int64_t shown_t0 = 0, shown_t1 = 0;
    int shown_columns = 0;
    uint64_t shown_version = ~uint64_t(0);
    uint64_t shown_serial = 0;  // bumped whenever shown_buckets is recomputed
    // The last draw showed the blocks' buckets for a window of a huge run whose events it
    // could not read (draw never queries): serve_memory_timeline_requests reads them.
    bool zoom_requested = false;
    // Zoomed windows of huge runs: the window's events from the reader (from the block holding
    // its start, whose state is known), cached per padded window.
    std::vector<MemoryPoint> zoom_points;
    std::array<int64_t, kNumMemCategories> zoom_cat_before{};
    int64_t zoom_total_before = 0;
    int64_t zoom_t0 = 0, zoom_t1 = 0;
    bool zoom_valid = false;
    uint64_t zoom_version = 0;
    // The plot as an image (views/memory_raster.h), rebuilt when what it shows changes.
    std::vector<uint8_t> plot_pixels;
    int plot_width = 0, plot_height = 0;
    uint64_t plot_texture = 0;   // TextureHost id (0: none yet)
    struct PlotKey {  // what plot_pixels shows
        int64_t t0 = 0, t1 = 0;
        uint64_t serial = ~uint64_t(0);  // of shown_buckets
        int device = -1, width = 0, height = 0;
        bool cells = false;
        size_t cell_count = 0;
        bool operator==(const PlotKey&) const = default;
    } plot_key;
    int64_t plot_builds = 0;     // how often it was rasterised (tests, bench)
    // Hover details (allocations around the cursor), cached per bucket: draw sets the bucket,
    // serve_memory_timeline_requests reads its events (hover_loaded).
    int64_t hover_t0 = -1, hover_t1 = -1;
    int hover_device = -1;
    bool hover_loaded = false;
    std::vector<storage::MemoryEventRow> hover_events;
    int64_t hover_events_in_window = 0;
    std::string error;

    // The highest device total among the events read so far (all devices when device < -1).
    int64_t peak_bytes(int device = -2) const;
    int active_device() const;
};

// Reads rows newer than the state holds; true when any arrived.
bool refresh_memory_timeline(MemoryTimelineViewState& s, storage::SessionReader& reader);
// Draw never queries; it records what it could not take from memory: a zoomed window of a huge
// run (zoom_requested) and the hovered bucket's allocations (hover_loaded == false). This reads
// them (true when it read something: draw again). With refresh, the only place this view
// touches the session.
bool memory_timeline_has_requests(const MemoryTimelineViewState& s);
bool serve_memory_timeline_requests(MemoryTimelineViewState& s, storage::SessionReader& reader);
// Buckets for the visible window of the active device at `n` pixel columns (what draw shows).
// With a null reader (the draw path) nothing is read: a zoomed window of a huge run that is
// not cached yet gets the blocks' buckets and *needs_reader = true.
std::vector<storage::MemoryBucket> memory_view_buckets(MemoryTimelineViewState& s, storage::SessionReader* reader, int n,
                                                       bool* needs_reader = nullptr);
void zoom_to_cell(MemoryTimelineViewState& s, size_t cell);
// Shows rank `rank` of a data-parallel run: drops what was read (textures released) and keeps
// the selection; false when the run has no such rank or its telemetry is missing.
bool select_memory_rank(MemoryTimelineViewState& s, int rank, TextureHost* host);
void release_memory_timeline_textures(MemoryTimelineViewState& s, TextureHost* host);
// Draws from the state only (no queries: see refresh_memory_timeline); `host` may be null (the
// plot image is still built in plot_pixels, but not shown).
void DrawMemoryTimelineView(MemoryTimelineViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry memory_timeline_view_entry();

// ---- compare overlay ----
// A run's progress over engine time: knot k (t_ns, x) starts chunk k, which runs until knot
// k + 1 and processes the tokens [x_k, x_k+1); the last knot is the run's end. Both fields are
// non-decreasing. Memory is put on this axis instead of wall-clock time, so runs of different
// speeds line up chunk by chunk.
struct ProgressKnot {
    int64_t t_ns = 0;
    double x = 0;
};
// The device total of `s` on the progress axis, per column of [0, x_hi) cut into n: the highest
// total held during any chunk whose tokens overlap the column (a chunk's tokens are processed
// together, so its peak belongs to all of them); NaN for the columns past the run's last knot,
// so a line ends where its run ends. Events before the first knot (loading) only set the total
// the first chunk starts from.
std::vector<double> memory_over_progress(const MemorySeries& s, const std::vector<ProgressKnot>& knots, double x_hi, int n);

// Overlay for the compare view: each state's total over its run's progress (knots[i]; a run
// with no knots is listed in the legend but not drawn). Returns where each line ends (x, data
// units; NaN when not drawn), for tests.
std::vector<double> DrawMemoryOverlay(std::vector<MemoryTimelineViewState*>& states, const std::vector<std::string>& names,
                                      const std::vector<std::vector<ProgressKnot>>& knots, ImVec2 size);

}  // namespace kv::views
