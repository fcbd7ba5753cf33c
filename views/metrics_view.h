// Metrics: one small plot per recorded metric (loss, accuracy, tokens/s, per-sample values...)
// over steps or over time, drawn as ImDrawList polylines (no ImPlot in Debian); hover shows the
// nearest point. Live: refresh reads only metric rows newer than its cursor.
// An evaluation (eval_long) also gets its per-token loss over position (the session's
// sample_tokens rows): smoothed with a moving window, the dense run of the same model and data
// overlaid, several selected runs overlaid; and a per-sample table of loss and accuracy.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "storage/run_info.h"
#include "views/plot_util.h"
#include "views/token_text.h"

namespace kv::storage {
class SessionReader;
}

namespace kv::views {

struct MetricSeries {
    std::string name;
    std::vector<int64_t> ids, steps, t_ns;  // one entry per metric row, in id order
    std::vector<double> values;
};

// A series as plot points: one per row, sorted by x (steps, or seconds since t0), with the
// data range (x and finite y).
struct MetricCurve {
    std::vector<double> x, y;
    std::vector<size_t> row;  // index into the series of each point
    double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
};
MetricCurve metric_curve(const MetricSeries& s, bool over_time, int64_t t0_ns);
// Index of the point nearest to x (data units), -1 if none.
int nearest_point(const MetricCurve& c, double x);

// Per-token loss of one run over input position: the mean over its samples (or one sample) of
// the loss at each position (positions no sample scored stay NaN), then smoothed.
// Mean over the samples that scored position t; NaN where none did. `sample` -1 = all samples.
std::vector<double> position_mean_loss(const std::vector<storage::SampleTokensRow>& samples, int64_t sample);
// Centred moving average over `window` positions (window <= 1: unchanged) of the finite values
// only: a position's smoothed value is the mean of the finite values within window/2 of it,
// NaN when there are none (gaps in sparse scoring stay gaps).
std::vector<double> smooth_finite(const std::vector<double>& y, int window);

struct TokenLossRun {
    int64_t run = 0;
    bool dense = false;     // the dense reference (drawn grey)
    bool selected = true;   // chosen in the runs table (false: the reference added for overlay)
    std::string label;      // "run 3 h2o-default"
    RunTokens tokens;
};

struct MetricsViewState {
    int64_t run = 0;
    // Other selected runs: their per-token loss and per-sample values overlay this run's.
    std::vector<int64_t> overlay_runs;
    int smoothing = 32;       // moving-window width in positions (1 = raw)
    int loss_sample = -1;     // -1: mean over samples; else that sample
    bool loss_minus_dense = false;  // curves as the difference to the dense run
    std::vector<TokenLossRun> loss_runs;  // this run, the overlay runs, then the dense reference
    bool over_time = false;  // x = seconds since the run started instead of steps
    std::vector<std::string> hidden;  // metric names the user hid
    // Per-layer series ("<family>.layer<N>", e.g. fidelity's 2 x 30 of SmolLM2-135M) start
    // hidden behind their mean over layers: the ones the user showed.
    std::vector<std::string> shown_layers;
    // ---- derived data ----
    std::vector<MetricSeries> series;  // by first appearance
    std::vector<MetricSeries> layer_means;  // per family of per-layer series: "<family>.mean_over_layers"
    std::map<std::string, size_t> index;
    int64_t last_id = 0;
    int64_t t0_ns = 0;
    uint64_t version = 0;
    std::string error;
    // The dense run of the same model and data in this session (0: none, or this run is dense),
    // whose curves are drawn under this run's: where a policy starts to lose against keeping
    // everything. Its metrics by name; read like this run's (by id cursor).
    int64_t reference_run = 0;
    bool reference_searched = false;
    std::map<std::string, MetricSeries> reference;
    int64_t reference_last_id = 0;
    // What the last draw showed (tests): the plots' names in order, the top of the scrolling
    // region that holds them, and how far it scrolls.
    std::vector<std::string> shown_plots;
    float shown_plots_top = 0, shown_plots_scroll_max = 0;
};

// "<family>.layer<N>": true, with the family and N.
bool per_layer_metric(const std::string& name, std::string* family = nullptr, int* layer = nullptr);
// Per family of per-layer series, the mean over the layers recorded at each step, named
// "<family>.mean_over_layers" (steps in order; time: the step's latest row).
std::vector<MetricSeries> layer_mean_series(const std::vector<MetricSeries>& series);
// Whether a curve is drawn: per-layer series only when the user showed them, the others
// (means over layers included) unless the user hid them.
bool metric_shown(const MetricsViewState& s, const std::string& name);
// The newest dense run in `runs` other than `run` whose model and data options equal run's
// (0 when there is none, or when `run` is dense itself).
int64_t find_dense_reference(const std::vector<storage::RunInfo>& runs, int64_t run);

// A metric recorded at one step only (an evaluation's mean loss, accuracy): shown as a number.
bool metric_is_scalar(const MetricSeries& m);
// What a metric's x axis counts: "sample" for eval_long's per-sample values, "step", or time.
const char* metric_x_title(const MetricSeries& m, bool over_time);

bool refresh_metrics(MetricsViewState& s, storage::SessionReader& reader);
void DrawMetricsView(MetricsViewState& s, ImVec2 size = ImVec2(0, 0));

// Its entry in the view table (views/view_table.h).
struct ViewEntry;
ViewEntry metrics_view_entry();

}  // namespace kv::views
