// Compare: 2-8 runs side by side — the configuration fields that differ, a metrics table with
// differences and ratios to the reference run (both from storage::compare_runs, what `kvlab
// compare` prints), eviction maps of every run synchronized on one layer/head/colour/window,
// and their memory timelines overlaid on a common "tokens processed" axis (runs aligned chunk by
// chunk, whatever their speed). Everything below the toolbar scrolls when the minimum sizes do
// not fit, rather than shrinking maps into slivers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/comparison.h"
#include "storage/run_info.h"
#include "views/difference_map.h"
#include "views/eviction_map.h"
#include "views/memory_timeline.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// One line of the metrics table: a value per run (reference first) and its comparison to the
// reference (difference for loss/accuracy, ratio otherwise; NaN when either side is missing).
struct CompareMetricRow {
    std::string name;
    bool difference = false;  // `relative` holds run - reference instead of run / reference
    std::vector<double> values, relative;
};
std::vector<CompareMetricRow> compare_metric_rows(const storage::Comparison& c);

// How the compared runs' maps tile the space given them: a wrapping grid of cells (cell_w,
// cell_h) in `cols` x `rows` with `gap` pixels between them, never smaller than min_w x min_h.
// Among the layouts that fit the height, the one whose maps come out largest; when none fits,
// the one with the fewest rows (the view scrolls to the rest).
constexpr float kCompareGap = 6;
constexpr float kCompareMinPanel = 200;  // px, each side of a map's panel (caption, axes, plot)
struct CompareGrid {
    int cols = 0, rows = 0;
    float cell_w = 0, cell_h = 0;
    float height(float gap = kCompareGap) const { return rows > 0 ? float(rows) * cell_h + float(rows - 1) * gap : 0.f; }
    float width(float gap = kCompareGap) const { return cols > 0 ? float(cols) * cell_w + float(cols - 1) * gap : 0.f; }
};
CompareGrid compare_grid(int n, float width, float height, float gap = kCompareGap, float min_w = kCompareMinPanel,
                         float min_h = kCompareMinPanel);

// A run's progress for the memory overlay: the first layer's cache steps of every sequence
// (sample), x = tokens processed before the step's chunk (samples one after another), and a last
// knot at max(its last step, t_end_ns) with x = every sample's tokens. Empty without steps.
std::vector<ProgressKnot> run_progress_knots(const EvictionData& d, int64_t t_end_ns);

// The difference map's pair when the user has not chosen one: the first pair (a < b, display
// order) whose maps of `layer` (and `sequence`) cut the sample the same way, so it can be
// diffed. When none can, a = 0, b = 1 and `why` is one sentence naming those two runs.
struct DifferencePair {
    int a = 0, b = 1;
    std::string why;
};
DifferencePair default_difference_pair(const std::vector<const EvictionData*>& data, const std::vector<std::string>& names,
                                       int sequence, int layer);

struct CompareViewState {
    std::vector<int64_t> runs;  // as selected
    int64_t reference = 0;      // 0: the first selected
    bool show_maps = true, show_memory = true;
    // ---- the eviction selection every map shows ----
    int layer = 0, head = 0, sequence = -1;
    EvictionColour colour = EvictionColour::PRESENCE;
    AxisRange steps_range{0, 1}, tokens_range{0, 1};
    bool follow = true;
    // ---- derived data ----
    storage::Comparison comparison;  // runs in comparison order (reference first)
    bool have_comparison = false;
    std::string comparison_error;
    std::vector<storage::RunInfo> infos;       // per compared run, same order
    std::vector<EvictionMapViewState> maps;    // per compared run, same order
    std::vector<MemoryTimelineViewState> memories;
    uint64_t version = 0;
    // ---- difference map: run A against run B, in place of the maps ----
    bool show_difference = false;
    int difference_a = 0, difference_run = 1;  // A and B: indices into the compared runs (display order, reference first)
    // False until the user picks A or B: meanwhile the pair is default_difference_pair's.
    bool difference_chosen = false;
    std::string difference_why;  // why no pair can be diffed (default pair only)
    DifferenceImage difference;
    uint64_t difference_texture = 0;
    struct DifferenceKey {
        uint64_t version_a = 0, version_b = 0;
        int run_a = -1, run = -1, layer = -1, head = -1, sequence = -2;
        bool operator==(const DifferenceKey&) const = default;
    } difference_key;
    bool difference_valid = false;
    // ---- what the last draw showed (tests) ----
    struct Shown {
        std::vector<ImVec4> maps;   // each map panel (caption and map): x0, y0, x1, y1 on screen, unscrolled
        ImVec4 body{};              // the scrolling region below the toolbar, on screen
        float scroll_max_x = 0, scroll_max_y = 0;  // how far it scrolls
        int colour_keys = 0;        // colour bars drawn (one for all maps)
        float memory_height = 0;    // the overlay's share (legend and plot)
        std::vector<double> memory_ends;  // where each run's memory line ends (tokens; NaN: not drawn)
    } shown;
};

// Rebuilds the difference image (and its texture) when its runs' data or selection changed.
void update_compare_difference(CompareViewState& s, TextureHost* host);

// Sets the runs (resetting per-run state; releases textures through `host`).
void compare_select(CompareViewState& s, const std::vector<int64_t>& runs, int64_t reference, TextureHost* host);
// Reads run rows, recomputes the comparison when a run changed (from the read-only reader),
// and refreshes every run's map and timeline.
bool refresh_compare(CompareViewState& s, storage::SessionReader& reader);
void release_compare_textures(CompareViewState& s, TextureHost* host);
// Draws from the state only (no queries; refresh_compare reads).
void DrawCompareView(CompareViewState& s, TextureHost* host, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry compare_view_entry();

}  // namespace kv::views
