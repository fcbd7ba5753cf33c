// Sweep: the session's quality-vs-cache-size curves (the data `kvlab plot` draws by default):
// one panel per task (data.name), one line per cache (kv_cache.name) and experiment over
// kv_cache.cache_length on a log2 axis, the dense runs of the task as horizontal references.
// Runs whose configurations differ in anything else (sequence length, samples, chunking, model,
// fidelity, ...) are separate lines; repeated runs of one configuration are one point, their
// mean with a standard-error bar and n. Any summary metric on y
// (auto: perplexity, else copy_token_accuracy, else accuracy, else mean_loss, per panel).
// Updates while a sweep runs (each refresh re-reads the runs table, new done runs appear);
// clicking a point asks the host to select that run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/needle_grid.h"
#include "storage/run_info.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

// A point or a reference is every done run of one configuration: their mean, with the
// standard error of the mean when a cell was run more than once.
struct SweepPoint {
    double x = 0, y = 0;  // cache length (slots), mean of the metric over the runs
    int64_t run = 0;      // the newest of them (a click selects it)
    double se = 0;        // standard error of the mean (0 for one run)
    int n = 1;            // runs of this configuration
    std::vector<int64_t> runs;  // all of them, ascending
    std::string samples;        // data.num_samples of the newest run (samples behind each run)
};
struct SweepLine {
    std::string label;       // kv_cache.name, then the experiment when the panel holds several
    std::string cache;       // kv_cache.name
    std::string experiment;  // "data.seq_length=1024, fidelity=true"; "" when the panel holds one
    std::vector<SweepPoint> points;  // sorted by x, one per cache length
};
struct SweepReference {
    std::string label;  // "dense", then the experiment as for lines
    std::string experiment;
    double y = 0;  // mean over the runs
    int64_t run = 0;
    double se = 0;
    int n = 1;
};
struct SweepPanel {
    std::string task;    // data.name
    std::string metric;  // what y shows in this panel
    // Configuration fields that differ among the panel's runs besides the cache and its
    // length: each combination is its own line (and reference), never merged into one.
    std::vector<std::string> experiment_fields;
    std::vector<SweepLine> lines;
    std::vector<SweepReference> references;  // dense runs
    int repeated = 0;  // points and references standing for more than one run
};

// The panels of `runs` (done runs of mode eval_long only) for `metric` ("auto" or a summary
// key). Pure: tested without a session.
std::vector<SweepPanel> sweep_panels(const std::vector<storage::RunInfo>& runs, const std::string& metric);
// Summary metrics the done eval_long runs record (numbers), sorted: the metric menu.
std::vector<std::string> sweep_metrics(const std::vector<storage::RunInfo>& runs);

struct SweepViewState {
    std::string metric = "auto";
    std::vector<SweepPanel> panels;
    std::vector<std::string> metrics;
    int64_t selected_run = 0;   // highlighted point (the host's selection)
    int64_t requested_run = 0;  // a click: the host selects this run and clears it
    size_t runs_seen = 0;
    int64_t last_finished_ms = 0;
    uint64_t version = 0;
    std::string error;
    std::vector<storage::RunInfo> runs;  // as read by the last refresh (done eval_long runs)
    // Runs that set their needles' depths (a needle grid, depth x length): the grid of
    // `kvlab plot --heatmap needle` (storage/needle_grid.h), one panel per cache; the view draws
    // it instead of the curves when needle_map is set (offered only when the grid has cells).
    storage::NeedleGrid needle;
    bool needle_map = false;
};

// The needle grid of the session's runs, one panel per kv_cache.name (as `kvlab plot --heatmap
// needle --by kv_cache.name`).
storage::NeedleGrid sweep_needle_grid(storage::SessionReader& reader);

// Re-reads the runs table; rebuilds the panels when a run finished or the metric changed.
bool refresh_sweep(SweepViewState& s, storage::SessionReader& reader);
void DrawSweepView(SweepViewState& s, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry sweep_view_entry();

}  // namespace kv::views
