// Sweep: the session's quality-vs-cache-size curves (the data `kvlab plot` draws by default):
// one panel per task (data.name), one line per cache (kv_cache.name) over kv_cache.cache_length
// on a log2 axis, the dense run of the task as a horizontal reference. Any summary metric on y
// (auto: perplexity, else copy_token_accuracy, else accuracy, else mean_loss, per panel).
// Updates while a sweep runs (each refresh re-reads the runs table, new done runs appear);
// clicking a point asks the host to select that run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/run_info.h"
#include "views/plot_util.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

struct SweepPoint {
    double x = 0, y = 0;  // cache length (slots), metric value
    int64_t run = 0;
};
struct SweepLine {
    std::string label;  // kv_cache.name
    std::vector<SweepPoint> points;  // sorted by x; a repeated x keeps the newest run
};
struct SweepReference {
    std::string label;
    double y = 0;
    int64_t run = 0;
};
struct SweepPanel {
    std::string task;    // data.name
    std::string metric;  // what y shows in this panel
    std::vector<SweepLine> lines;
    std::vector<SweepReference> references;  // dense runs
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
};

// Re-reads the runs table; rebuilds the panels when a run finished or the metric changed.
bool refresh_sweep(SweepViewState& s, storage::SessionReader& reader);
void DrawSweepView(SweepViewState& s, ImVec2 size = ImVec2(0, 0));

}  // namespace kv::views
