// Compare: 2-8 runs side by side — the configuration fields that differ, a metrics table with
// differences and ratios to the reference run (both from storage::compare_runs, what `kvlab
// compare` prints), eviction maps of every run synchronized on one layer/head/colour/window,
// and their memory timelines overlaid on a common "time since start" axis.
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

// How the compared runs' maps tile the space given them: every map visible, cells of
// (cell_w, cell_h) in `cols` x `rows` with `gap` pixels between them, chosen so the maps come out
// as large as possible.
constexpr float kCompareGap = 6;
struct CompareGrid {
    int cols = 0, rows = 0;
    float cell_w = 0, cell_h = 0;
};
CompareGrid compare_grid(int n, float width, float height, float gap = kCompareGap);

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
    // ---- difference map: run A (the reference unless chosen) against run B, in place of the maps ----
    bool show_difference = false;
    int difference_a = 0, difference_run = 1;  // A and B: indices into the compared runs (display order, reference first)
    DifferenceImage difference;
    uint64_t difference_texture = 0;
    struct DifferenceKey {
        uint64_t version_a = 0, version_b = 0;
        int run_a = -1, run = -1, layer = -1, head = -1, sequence = -2;
        bool operator==(const DifferenceKey&) const = default;
    } difference_key;
    bool difference_valid = false;
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

}  // namespace kv::views
