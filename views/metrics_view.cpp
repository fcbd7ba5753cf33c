// Metrics view (see metrics_view.h).
#include "views/view_table.h"
#include "views/metrics_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "storage/config_fields.h"
#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

MetricCurve metric_curve(const MetricSeries& s, bool over_time, int64_t t0_ns) {
    MetricCurve c;
    const size_t n = s.values.size();
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t(0));
    auto xof = [&](size_t i) { return over_time ? double(s.t_ns[i] - t0_ns) * 1e-9 : double(s.steps[i]); };
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return xof(a) < xof(b); });
    c.x.reserve(n), c.y.reserve(n), c.row.reserve(n);
    double ylo = 1e300, yhi = -1e300;
    for (size_t i : order) {
        c.x.push_back(xof(i));
        c.y.push_back(s.values[i]);
        c.row.push_back(i);
        if (std::isfinite(s.values[i])) ylo = std::min(ylo, s.values[i]), yhi = std::max(yhi, s.values[i]);
    }
    if (n) c.x_lo = c.x.front(), c.x_hi = c.x.back();
    if (c.x_hi <= c.x_lo) c.x_lo -= 0.5, c.x_hi += 0.5;
    if (ylo <= yhi) c.y_lo = ylo, c.y_hi = yhi;
    if (c.y_hi <= c.y_lo) {  // one value: a readable range around it (0 -> [-0.5, 0.5], not +-1e-9)
        const double pad = std::max(0.5, std::fabs(c.y_lo) * 0.1);
        c.y_lo -= pad, c.y_hi += pad;
    }
    return c;
}

int nearest_point(const MetricCurve& c, double x) {
    if (c.x.empty()) return -1;
    const auto it = std::lower_bound(c.x.begin(), c.x.end(), x);
    size_t i = size_t(it - c.x.begin());
    if (i == c.x.size()) return int(i - 1);
    if (i > 0 && x - c.x[i - 1] < c.x[i] - x) --i;
    return int(i);
}

std::vector<double> position_mean_loss(const std::vector<storage::SampleTokensRow>& samples, int64_t sample) {
    size_t T = 0;
    for (const auto& r : samples)
        if (sample < 0 || r.sample == sample) T = std::max(T, r.loss.size());
    std::vector<double> sum(T, 0.0), n(T, 0.0);
    for (const auto& r : samples) {
        if (sample >= 0 && r.sample != sample) continue;
        for (size_t t = 0; t < r.loss.size(); ++t)
            if (std::isfinite(r.loss[t])) sum[t] += double(r.loss[t]), n[t] += 1;
    }
    for (size_t t = 0; t < T; ++t) sum[t] = n[t] > 0 ? sum[t] / n[t] : std::nan("");
    return sum;
}

std::vector<double> smooth_finite(const std::vector<double>& y, int window) {
    if (window <= 1) return y;
    // Prefix sums of the finite values and of their count: each window is two differences.
    const size_t n = y.size();
    std::vector<double> ps(n + 1, 0.0), pc(n + 1, 0.0);
    for (size_t i = 0; i < n; ++i) {
        const bool ok = std::isfinite(y[i]);
        ps[i + 1] = ps[i] + (ok ? y[i] : 0.0);
        pc[i + 1] = pc[i] + (ok ? 1.0 : 0.0);
    }
    const size_t half = size_t(window / 2);
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
        const size_t lo = i > half ? i - half : 0, hi = std::min(n, i + half + 1);
        const double c = pc[hi] - pc[lo];
        out[i] = c > 0 ? (ps[hi] - ps[lo]) / c : std::nan("");
    }
    return out;
}

int64_t find_dense_reference(const std::vector<storage::RunInfo>& runs, int64_t run) {
    const auto it = std::find_if(runs.begin(), runs.end(), [&](const storage::RunInfo& r) { return r.id == run; });
    if (it == runs.end()) return 0;
    auto policy = [](const storage::RunInfo& r) {
        return storage::run_policy(r.config);
    };
    if (policy(*it) == "dense") return 0;
    // Same model and the same samples: every data option and the mode agree.
    static const char* const kSame[] = {"mode",         "model",        "data",           "data.seq_length", "data.num_samples",
                                        "data.seed",    "data.num_keys", "data.depths",   "data.files",      "data.path",
                                        "data.repeat_length", "data.repeat_distance", "data.dataset_key", "data.max_seq_length"};
    int64_t best = 0;
    for (const auto& r : runs) {
        if (r.id == run || policy(r) != "dense") continue;
        bool same = true;
        for (const char* k : kSame) same &= storage::run_config_value(r.config, k) == storage::run_config_value(it->config, k);
        if (same) best = std::max(best, r.id);
    }
    return best;
}

bool per_layer_metric(const std::string& name, std::string* family, int* layer) {
    const size_t at = name.rfind(".layer");
    if (at == std::string::npos || at + 6 >= name.size()) return false;
    for (size_t i = at + 6; i < name.size(); ++i)
        if (name[i] < '0' || name[i] > '9') return false;
    if (family) *family = name.substr(0, at);
    if (layer) *layer = std::stoi(name.substr(at + 6));
    return true;
}

std::vector<MetricSeries> layer_mean_series(const std::vector<MetricSeries>& series) {
    struct Acc {
        double sum = 0;
        int n = 0;
        int64_t t_ns = 0, id = 0;
    };
    std::map<std::string, std::map<int64_t, Acc>> by_family;  // family -> step -> sum
    for (const MetricSeries& m : series) {
        std::string family;
        if (!per_layer_metric(m.name, &family)) continue;
        auto& steps = by_family[family];
        for (size_t i = 0; i < m.values.size(); ++i) {
            if (!std::isfinite(m.values[i])) continue;
            Acc& a = steps[m.steps[i]];
            a.sum += m.values[i], ++a.n, a.t_ns = std::max(a.t_ns, m.t_ns[i]), a.id = std::max(a.id, m.ids[i]);
        }
    }
    std::vector<MetricSeries> out;
    for (const auto& [family, steps] : by_family) {
        MetricSeries m;
        m.name = family + ".mean_over_layers";
        for (const auto& [step, a] : steps)
            m.ids.push_back(a.id), m.steps.push_back(step), m.t_ns.push_back(a.t_ns), m.values.push_back(a.sum / a.n);
        out.push_back(std::move(m));
    }
    return out;
}

bool metric_shown(const MetricsViewState& s, const std::string& name) {
    if (per_layer_metric(name)) return std::find(s.shown_layers.begin(), s.shown_layers.end(), name) != s.shown_layers.end();
    return std::find(s.hidden.begin(), s.hidden.end(), name) == s.hidden.end();
}

bool refresh_metrics(MetricsViewState& s, storage::SessionReader& reader) {
    try {
        bool any_reference = false;
        if (!s.reference_searched) {
            const std::vector<storage::RunInfo> runs = reader.runs();
            s.reference_run = find_dense_reference(runs, s.run);
            s.reference_searched = true;
            // The per-token loss curves: the selected runs, then the dense reference.
            std::vector<int64_t> ids{s.run};
            ids.insert(ids.end(), s.overlay_runs.begin(), s.overlay_runs.end());
            if (s.reference_run && std::find(ids.begin(), ids.end(), s.reference_run) == ids.end()) ids.push_back(s.reference_run);
            s.loss_runs.clear();
            for (size_t i = 0; i < ids.size(); ++i) {
                TokenLossRun lr;
                lr.run = ids[i];
                lr.tokens.run = ids[i];
                lr.selected = i <= s.overlay_runs.size();
                for (const auto& r : runs)
                    if (r.id == ids[i]) {
                        const std::string cache = storage::run_config_value(r.config, "kv_cache.name");
                        lr.dense = storage::run_policy(r.config) == "dense";
                        lr.label = "run " + std::to_string(r.id) + " " + (cache.empty() ? r.name : cache);
                    }
                s.loss_runs.push_back(std::move(lr));
            }
        }
        for (auto& lr : s.loss_runs)
            if (refresh_run_tokens(lr.tokens, reader)) any_reference = true, ++s.version;
        if (s.reference_run) {
            for (auto& r : reader.metrics(s.reference_run, "", s.reference_last_id)) {
                s.reference_last_id = std::max(s.reference_last_id, r.id);
                MetricSeries& m = s.reference[r.name];
                m.name = r.name;
                m.ids.push_back(r.id), m.steps.push_back(r.step), m.t_ns.push_back(r.t_ns), m.values.push_back(r.value);
                any_reference = true;
            }
            if (any_reference) {
                // The dense run's means over layers, under the same names as this run's.
                std::vector<MetricSeries> ref;
                for (const auto& [name, m] : s.reference)
                    if (per_layer_metric(name)) ref.push_back(m);
                for (MetricSeries& m : layer_mean_series(ref)) s.reference[m.name] = std::move(m);
                ++s.version;
            }
        }
        if (s.t0_ns == 0) s.t0_ns = reader.run(s.run).t0_ns;
        std::vector<storage::MetricRow> rows = reader.metrics(s.run, "", s.last_id);
        for (auto& r : rows) {
            s.last_id = std::max(s.last_id, r.id);
            auto [it, inserted] = s.index.emplace(r.name, s.series.size());
            if (inserted) s.series.push_back({r.name, {}, {}, {}, {}});
            MetricSeries& m = s.series[it->second];
            m.ids.push_back(r.id);
            m.steps.push_back(r.step);
            m.t_ns.push_back(r.t_ns);
            m.values.push_back(r.value);
        }
        if (!rows.empty()) {
            s.layer_means = layer_mean_series(s.series);
            ++s.version;
        }
        s.error.clear();
        return !rows.empty() || any_reference;
    } catch (const std::exception& e) {
        s.error = e.what();
        return false;
    }
}

bool metric_is_scalar(const MetricSeries& m) {
    for (size_t i = 1; i < m.steps.size(); ++i)
        if (m.steps[i] != m.steps[0]) return false;
    return true;
}

const char* metric_x_title(const MetricSeries& m, bool over_time) {
    if (over_time) return "time since run start";
    // eval_long records per-sample values with step = the sample's index
    return m.name.rfind("sample_", 0) == 0 ? "sample" : "step";
}

namespace {

bool has_token_loss(const MetricsViewState& s) {
    for (const auto& lr : s.loss_runs)
        for (const auto& r : lr.tokens.samples)
            if (!r.loss.empty()) return true;
    return false;
}

Colour loss_run_colour(const TokenLossRun& lr, size_t i) {
    return lr.dense ? pack_rgba(175, 175, 180, 230) : series_colour(int(i));
}

// Per-token loss over input position: each run's curve (mean over samples, or one sample),
// smoothed; the dense run grey; hover lists every run's value and the token there.
void draw_token_loss(MetricsViewState& s, float width, float height) {
    int64_t max_samples = 0, scored = 0;
    for (const auto& lr : s.loss_runs) max_samples = std::max<int64_t>(max_samples, int64_t(lr.tokens.samples.size()));
    for (const auto& r : s.loss_runs.front().tokens.samples) scored += r.scored;
    const TokenLossRun* dense = nullptr;
    for (const auto& lr : s.loss_runs)
        if (lr.dense) dense = &lr;
    ImGui::TextDisabled("per-token loss over position:");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(160);
    ImGui::SliderInt("smoothing (positions)", &s.smoothing, 1, 1024, "%d", ImGuiSliderFlags_Logarithmic);
    if (max_samples > 1) {
        ImGui::SameLine();
        ImGui::SetNextItemWidth(120);
        s.loss_sample = std::clamp<int>(s.loss_sample, -1, int(max_samples) - 1);
        ImGui::SliderInt("sample (-1 = mean)", &s.loss_sample, -1, int(max_samples) - 1);
    }
    const bool can_diff = dense && !(s.loss_runs.size() == 1);
    if (can_diff) {
        ImGui::SameLine();
        ImGui::Checkbox("minus dense", &s.loss_minus_dense);
    }
    const bool diff = can_diff && s.loss_minus_dense;
    // Curves: raw mean per position, then smoothed (the dense one too, for the difference).
    std::vector<std::vector<double>> ys(s.loss_runs.size());
    for (size_t i = 0; i < s.loss_runs.size(); ++i)
        ys[i] = smooth_finite(position_mean_loss(s.loss_runs[i].tokens.samples, s.loss_sample), s.smoothing);
    std::vector<double> dense_y;
    if (dense) dense_y = ys[size_t(dense - s.loss_runs.data())];
    if (diff)
        for (size_t i = 0; i < ys.size(); ++i) {
            if (&s.loss_runs[i] == dense) continue;
            for (size_t t = 0; t < ys[i].size(); ++t) ys[i][t] = t < dense_y.size() ? ys[i][t] - dense_y[t] : std::nan("");
        }
    double xhi = 1, ylo = 1e300, yhi = -1e300;
    int64_t finite_points = 0, first = -1, last = -1;  // the scored positions' range
    for (size_t i = 0; i < ys.size(); ++i) {
        if (diff && &s.loss_runs[i] == dense) continue;
        xhi = std::max(xhi, double(ys[i].size()));
        for (size_t t = 0; t < ys[i].size(); ++t)
            if (const double v = ys[i][t]; std::isfinite(v)) {
                ylo = std::min(ylo, v), yhi = std::max(yhi, v), ++finite_points;
                first = first < 0 ? int64_t(t) : std::min(first, int64_t(t));
                last = std::max(last, int64_t(t));
            }
    }
    if (diff) ylo = std::min(ylo, 0.0), yhi = std::max(yhi, 0.0);
    if (ylo > yhi) ylo = 0, yhi = 1;
    if (yhi - ylo < 1e-6) ylo -= 0.5, yhi += 0.5;
    const double ypad = (yhi - ylo) * 0.06;
    // x: the scored positions (a copy span, an answer) when they are a small part of the
    // sequence, else the whole sequence.
    AxisRange xr{0, xhi};
    if (first >= 0 && double(last - first + 1) < 0.5 * xhi) {
        const double pad = std::max(2.0, double(last - first) * 0.04);
        xr = {std::max(0.0, double(first) - pad), std::min(xhi, double(last) + pad)};
    }
    const AxisRange yr{ylo - ypad, yhi + ypad};
    char ytitle[160];
    std::snprintf(ytitle, sizeof ytitle, "%s (nats)%s%s", diff ? "loss minus the dense run's" : "loss",
                  s.smoothing > 1 ? ", moving mean over " : "", s.smoothing > 1 ? std::to_string(s.smoothing).append(" positions").c_str() : "");
    const AxisSpec xs{AxisUnit::INTEGER, "input position (the loss of predicting the next token there)"};
    const AxisSpec ysp{AxisUnit::NUMBER, ytitle};
    const PlotFrame f = begin_plot_frame("##token_loss", ImVec2(width, height), plot_margins(&xs, &ysp, &yr, height));
    ImDrawList* dl = ImGui::GetWindowDrawList();
    dl->AddRectFilled(f.p0, f.p1, IM_COL32(26, 26, 30, 255));
    if (diff) {
        const float y0 = float(axis_to_pixel(yr, 0.0, f.p1.y, f.p0.y));
        dl->AddLine(ImVec2(f.p0.x, y0), ImVec2(f.p1.x, y0), IM_COL32(175, 175, 180, 160), 1.f);
    }
    dl->PushClipRect(f.p0, f.p1, true);
    // Dense first (underneath), then the others in order.
    std::vector<size_t> order;
    for (size_t i = 0; i < ys.size(); ++i)
        if (&s.loss_runs[i] == dense && !diff) order.insert(order.begin(), i);
        else if (&s.loss_runs[i] != dense) order.push_back(i);
    for (size_t i : order) {
        const Colour col = loss_run_colour(s.loss_runs[i], i);
        std::vector<ImVec2> seg;
        int64_t n_finite = 0;
        for (double v : ys[i]) n_finite += std::isfinite(v) ? 1 : 0;
        auto flush = [&] {
            if (seg.size() > 1) dl->AddPolyline(seg.data(), int(seg.size()), col, 0, 1.5f);
            seg.clear();
        };
        for (size_t t = 0; t < ys[i].size(); ++t) {
            if (!std::isfinite(ys[i][t])) {
                flush();
                continue;
            }
            const ImVec2 p(float(axis_to_pixel(xr, double(t), f.p0.x, f.p1.x)), float(axis_to_pixel(yr, ys[i][t], f.p1.y, f.p0.y)));
            seg.push_back(p);
            if (n_finite < 300) dl->AddCircleFilled(p, 2.5f, col);  // sparse scoring: every point visible
        }
        flush();
    }
    dl->PopClipRect();
    draw_x_axis(dl, f, xr, xs);
    draw_y_axis(dl, f, yr, ysp, false);
    // Legend inside the plot, top right, on a dark box so curves under it stay readable.
    float lw = 0;
    for (const auto& lr : s.loss_runs) lw = std::max(lw, ImGui::CalcTextSize((lr.label + (lr.dense ? " (dense)" : "")).c_str()).x);
    const float line = ImGui::GetTextLineHeight();
    ImVec2 lp(f.p1.x - lw - 30, f.p0.y + 4);
    dl->AddRectFilled(ImVec2(lp.x - 4, lp.y - 2), ImVec2(f.p1.x - 4, lp.y + line * float(s.loss_runs.size()) + 2), IM_COL32(20, 20, 24, 200));
    for (size_t i = 0; i < s.loss_runs.size(); ++i) {
        const TokenLossRun& lr = s.loss_runs[i];
        dl->AddRectFilled(ImVec2(lp.x, lp.y + 4), ImVec2(lp.x + 14, lp.y + line - 4), loss_run_colour(lr, i));
        const std::string text = lr.label + (lr.dense ? " (dense)" : "") + (lr.tokens.samples.empty() ? " - no per-token loss" : "");
        dl->AddText(ImVec2(lp.x + 20, lp.y), IM_COL32(220, 220, 220, 240), text.c_str());
        lp.y += line;
    }
    if (finite_points == 0)
        dl->AddText(ImVec2(f.p0.x + 8, f.p0.y + 8), IM_COL32(220, 200, 160, 240), "no scored positions in this selection");
    if (f.hovered) {
        const double x = pixel_to_axis(xr, f.mouse.x, f.p0.x, f.p1.x);
        const int64_t t = std::clamp<int64_t>(int64_t(std::llround(x)), 0, int64_t(xhi) - 1);
        const float px = float(axis_to_pixel(xr, double(t), f.p0.x, f.p1.x));
        dl->AddLine(ImVec2(px, f.p0.y), ImVec2(px, f.p1.y), IM_COL32(255, 255, 255, 90));
        ImGui::BeginTooltip();
        ImGui::Text("input position %lld", (long long)t);
        const int64_t sample = s.loss_sample >= 0 ? s.loss_sample : 0;
        const std::string text = token_label(s.loss_runs.front().tokens.sample(sample), t);
        if (!text.empty()) ImGui::Text("token %s%s", text.c_str(), s.loss_sample >= 0 ? "" : " (sample 0)");
        for (size_t i = 0; i < s.loss_runs.size(); ++i) {
            if (diff && &s.loss_runs[i] == dense) continue;
            const double v = size_t(t) < ys[i].size() ? ys[i][size_t(t)] : std::nan("");
            ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(loss_run_colour(s.loss_runs[i], i)), "%s: %s", s.loss_runs[i].label.c_str(),
                               std::isfinite(v) ? (std::to_string(v).substr(0, 8) + (diff ? " over dense" : "")).c_str() : "not scored here");
        }
        ImGui::TextDisabled("%lld scored positions in %zu samples of run %lld", (long long)scored,
                            s.loss_runs.front().tokens.samples.size(), (long long)s.loss_runs.front().run);
        ImGui::EndTooltip();
    }
}

// One row per sample: its description and, per run, the loss and whether it was right.
void draw_sample_table(const MetricsViewState& s, float width, float height) {
    size_t rows = 0;
    for (const auto& lr : s.loss_runs) rows = std::max(rows, lr.tokens.samples.size());
    if (rows == 0) return;
    const int cols = 2 + 2 * int(s.loss_runs.size());
    if (cols > 64) return;
    const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY |
                                  ImGuiTableFlags_SizingFixedFit;
    if (!ImGui::BeginTable("##samples", cols, flags, ImVec2(width, height))) return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("sample");
    ImGui::TableSetupColumn("description", ImGuiTableColumnFlags_WidthStretch);
    for (const auto& lr : s.loss_runs) {
        ImGui::TableSetupColumn((lr.label + " loss").c_str());
        ImGui::TableSetupColumn("right");
    }
    ImGui::TableHeadersRow();
    for (size_t i = 0; i < rows; ++i) {
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::Text("%zu", i);
        ImGui::TableNextColumn();
        const storage::SampleTokensRow* first = nullptr;
        for (const auto& lr : s.loss_runs)
            if (!first) first = lr.tokens.sample(int64_t(i));
        ImGui::TextUnformatted(first ? first->description.c_str() : "");
        for (const auto& lr : s.loss_runs) {
            const storage::SampleTokensRow* r = lr.tokens.sample(int64_t(i));
            ImGui::TableNextColumn();
            if (r && std::isfinite(r->mean_loss)) ImGui::Text("%.4f", r->mean_loss);
            else ImGui::TextDisabled("-");
            ImGui::TableNextColumn();
            if (!r || (r->correct < 0 && r->token_accuracy < 0)) ImGui::TextDisabled("-");
            else if (r->token_accuracy >= 0) ImGui::Text("%s %.0f%%", r->correct == 1 ? "yes" : "no", 100 * r->token_accuracy);
            else ImGui::Text("%s", r->correct == 1 ? "yes" : "no");
            if (r && ImGui::IsItemHovered())
                ImGui::SetTooltip("%s, sample %zu: %s%s", lr.label.c_str(), i, r->correct == 1 ? "right" : r->correct == 0 ? "wrong" : "no answer to check",
                                  r->token_accuracy >= 0 ? " (the percentage: answer tokens right)" : "");
        }
    }
    ImGui::EndTable();
}

}  // namespace

void DrawMetricsView(MetricsViewState& s, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) {
        const ImVec2 avail = ImGui::GetContentRegionAvail();
        if (size.x <= 0) size.x = avail.x;
        if (size.y <= 0) size.y = avail.y;
    }
    ImGui::PushID("metrics");
    ImGui::BeginGroup();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    if (!s.loss_runs.empty() && has_token_loss(s)) {
        // An evaluation: per-token loss first (most of the height), then the per-sample table;
        // the recorded metrics (per-sample curves, summary numbers) below.
        size_t rows = 0;
        for (const auto& lr : s.loss_runs) rows = std::max(rows, lr.tokens.samples.size());
        const float line = ImGui::GetFrameHeightWithSpacing();
        const float table_h = std::min(size.y * 0.25f, line * float(rows + 1) + 8);
        // The rest of the height, less the summary line and room for curves other than the
        // per-sample ones the table shows (training, fidelity).
        size_t other_curves = 0;
        for (const auto& m : s.series) other_curves += m.name.rfind("sample_", 0) != 0 && !metric_is_scalar(m);
        const float below = other_curves && s.overlay_runs.empty() ? size.y * 0.4f : 3 * line;
        const float plot_h = std::max(160.f, size.y - (ImGui::GetCursorPosY() - top) - 2 * line - table_h - below);
        draw_token_loss(s, size.x, plot_h);
        draw_sample_table(s, size.x, table_h);
        if (!s.overlay_runs.empty()) {  // several runs: the per-run metric plots belong to one run at a time
            ImGui::TextDisabled("metric plots: select one run");
            ImGui::EndGroup();
            ImGui::PopID();
            return;
        }
    } else if (!s.overlay_runs.empty()) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("none of the selected runs recorded a per-token loss (eval_long records it); select one run for its metrics");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    if (s.series.empty()) {
        ImGui::Dummy(ImVec2(size.x, 0));
        draw_empty_state("no metrics recorded yet");
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    // Values recorded once (an evaluation's mean loss, accuracy, throughput) are numbers, not
    // one-dot plots: they go in a summary line.
    std::vector<size_t> curves, scalars;
    const bool table_shown = !s.loss_runs.empty() && has_token_loss(s);
    for (size_t i = 0; i < s.series.size(); ++i) {
        // The per-sample table above already shows sample_loss / sample_correct.
        if (table_shown && s.series[i].name.rfind("sample_", 0) == 0) continue;
        (metric_is_scalar(s.series[i]) ? scalars : curves).push_back(i);
    }
    if (!scalars.empty()) {
        ImGui::TextDisabled("summary:");
        for (size_t i : scalars) {
            const MetricSeries& m = s.series[i];
            ImGui::SameLine();
            if (ImGui::GetCursorPosX() + ImGui::CalcTextSize(m.name.c_str()).x + 90 > size.x) ImGui::NewLine();
            ImGui::Text("%s %.6g", m.name.c_str(), m.values.empty() ? 0.0 : m.values.back());
            if (ImGui::IsItemHovered())
                ImGui::SetTooltip("%s = %.10g (recorded once, at step %lld)", m.name.c_str(), m.values.empty() ? 0.0 : m.values.back(),
                                  m.steps.empty() ? 0LL : (long long)m.steps.back());
        }
    }
    if (curves.empty()) {
        ImGui::EndGroup();
        ImGui::PopID();
        return;
    }
    // Every curve: the run's own series (per-layer ones apart), then the means over layers.
    std::vector<const MetricSeries*> all;
    std::map<std::string, std::vector<const MetricSeries*>> families;  // per-layer series by family
    for (size_t i : curves) {
        std::string family;
        if (per_layer_metric(s.series[i].name, &family)) families[family].push_back(&s.series[i]);
        else all.push_back(&s.series[i]);
    }
    for (const MetricSeries& m : s.layer_means) all.push_back(&m);
    for (auto& [family, list] : families) {
        std::sort(list.begin(), list.end(), [](const MetricSeries* a, const MetricSeries* b) {
            int la = 0, lb = 0;
            per_layer_metric(a->name, nullptr, &la), per_layer_metric(b->name, nullptr, &lb);
            return la < lb;
        });
        all.insert(all.end(), list.begin(), list.end());
    }
    auto colour_of = [&](const MetricSeries* m) { return series_colour(int(std::find(all.begin(), all.end(), m) - all.begin())); };
    auto toggle = [&](const MetricSeries* m, bool show) {
        auto& list = per_layer_metric(m->name) ? s.shown_layers : s.hidden;
        const bool listed_means_shown = per_layer_metric(m->name);
        list.erase(std::remove(list.begin(), list.end(), m->name), list.end());
        if (show == listed_means_shown) list.push_back(m->name);
    };
    auto checkbox = [&](const MetricSeries* m, const char* label) {
        bool shown = metric_shown(s, m->name);
        ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(colour_of(m)));
        if (ImGui::Checkbox(label, &shown)) toggle(m, shown);
        ImGui::PopStyleColor();
    };
    // The choice of curves in a list of its own beside the plots, scrolling by itself: however
    // many series a run records, the plots stay in view.
    const float rest_h = std::max(120.f, size.y - (ImGui::GetCursorPosY() - top));
    // As wide as its longest entry (checkbox, tree arrow and indent included), within reason.
    float label_w = ImGui::CalcTextSize("over time").x;
    for (const MetricSeries* m : all)
        if (!per_layer_metric(m->name)) label_w = std::max(label_w, ImGui::CalcTextSize(m->name.c_str()).x);
    for (const auto& [family, list] : families)
        label_w = std::max(label_w, ImGui::CalcTextSize((family + " per layer (000 of 000 shown)").c_str()).x);
    const ImGuiStyle& style = ImGui::GetStyle();
    const float list_w = std::clamp(label_w + ImGui::GetFrameHeight() + 2 * style.WindowPadding.x + style.ItemInnerSpacing.x +
                                        style.ScrollbarSize + 4,
                                    180.f, std::max(180.f, size.x * 0.35f));
    ImGui::BeginChild("##curves", ImVec2(list_w, rest_h), true);
    ImGui::Checkbox("over time", &s.over_time);
    ImGui::Separator();
    for (const MetricSeries* m : all)
        if (!per_layer_metric(m->name)) checkbox(m, m->name.c_str());
    for (const auto& [family, list] : families) {
        ImGui::PushID(family.c_str());
        // The count shown says which families hold checked curves while their node is closed.
        size_t on = 0;
        for (const MetricSeries* m : list) on += metric_shown(s, m->name);
        char label[200];
        std::snprintf(label, sizeof label, "%s per layer (%zu of %zu shown)###%s", family.c_str(), on, list.size(), family.c_str());
        if (ImGui::TreeNode(label)) {
            if (ImGui::SmallButton("all"))
                for (const MetricSeries* m : list) toggle(m, true);
            ImGui::SameLine();
            if (ImGui::SmallButton("none"))
                for (const MetricSeries* m : list) toggle(m, false);
            for (const MetricSeries* m : list) {
                int layer = 0;
                per_layer_metric(m->name, nullptr, &layer);
                checkbox(m, ("layer " + std::to_string(layer)).c_str());
            }
            ImGui::TreePop();
        }
        ImGui::PopID();
    }
    ImGui::EndChild();
    ImGui::SameLine();
    std::vector<const MetricSeries*> visible;
    for (const MetricSeries* m : all)
        if (metric_shown(s, m->name)) visible.push_back(m);
    const float plots_w = std::max(120.f, size.x - list_w - ImGui::GetStyle().ItemSpacing.x);
    ImGui::BeginChild("##plots", ImVec2(plots_w, rest_h), false);
    s.shown_plots.clear();
    s.shown_plots_top = ImGui::GetWindowPos().y;
    if (visible.empty()) ImGui::TextDisabled("no curve checked: choose some in the list on the left");
    // Plots share the height down to a readable minimum, then the region scrolls.
    const float inner_w = plots_w - ImGui::GetStyle().ScrollbarSize;
    const float each = std::max(170.f, rest_h / float(std::max<size_t>(1, visible.size())) - ImGui::GetStyle().ItemSpacing.y);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    for (size_t vi = 0; vi < visible.size(); ++vi) {
        const MetricSeries& m = *visible[vi];
        s.shown_plots.push_back(m.name);
        ImGui::PushID(m.name.c_str());
        MetricCurve c = metric_curve(m, s.over_time, s.t0_ns);
        // The dense run's curve of the same metric, by step (its times are its own run's).
        const auto ref_it = s.over_time ? s.reference.end() : s.reference.find(m.name);
        MetricCurve rc;
        if (ref_it != s.reference.end() && !ref_it->second.values.empty()) {
            rc = metric_curve(ref_it->second, false, 0);
            c.x_lo = std::min(c.x_lo, rc.x_lo), c.x_hi = std::max(c.x_hi, rc.x_hi);
            c.y_lo = std::min(c.y_lo, rc.y_lo), c.y_hi = std::max(c.y_hi, rc.y_hi);
        }
        const double xpad = (c.x_hi - c.x_lo) * 0.03, ypad = (c.y_hi - c.y_lo) * 0.08;
        const AxisRange xr{c.x_lo - xpad, c.x_hi + xpad}, yr{c.y_lo - ypad, c.y_hi + ypad};
        char title[200];
        std::snprintf(title, sizeof title, "%s  (%zu points, last %.5g)%s", m.name.c_str(), m.values.size(),
                      m.values.empty() ? 0.0 : m.values.back(), rc.x.empty() ? "" : "   grey: the dense run");
        if (!rc.x.empty()) std::snprintf(title + std::strlen(title), sizeof title - std::strlen(title), " (run %lld)", (long long)s.reference_run);
        const AxisSpec xs{s.over_time ? AxisUnit::SECONDS : AxisUnit::INTEGER, metric_x_title(m, s.over_time)};
        const AxisSpec ys{AxisUnit::NUMBER, title};
        const PlotFrame f = begin_plot_frame("##plot", ImVec2(inner_w, each), plot_margins(&xs, &ys, &yr, each));
        dl->AddRectFilled(f.p0, f.p1, IM_COL32(26, 26, 30, 255));
        std::vector<ImVec2> pts;
        pts.reserve(c.x.size());
        for (size_t k = 0; k < c.x.size(); ++k)
            if (std::isfinite(c.y[k]))
                pts.push_back(ImVec2(float(axis_to_pixel(xr, c.x[k], f.p0.x, f.p1.x)), float(axis_to_pixel(yr, c.y[k], f.p1.y, f.p0.y))));
        if (!rc.x.empty()) {
            std::vector<ImVec2> rp;
            for (size_t k = 0; k < rc.x.size(); ++k)
                if (std::isfinite(rc.y[k]))
                    rp.push_back(ImVec2(float(axis_to_pixel(xr, rc.x[k], f.p0.x, f.p1.x)), float(axis_to_pixel(yr, rc.y[k], f.p1.y, f.p0.y))));
            const Colour grey = pack_rgba(170, 170, 175, 200);
            if (rp.size() > 1) dl->AddPolyline(rp.data(), int(rp.size()), grey, 0, 1.5f);
            if (rp.size() < 200)
                for (const auto& p : rp) dl->AddCircleFilled(p, 2.f, grey);
        }
        const Colour col = colour_of(&m);
        if (pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), col, 0, 1.5f);
        if (pts.size() < 200)
            for (const auto& p : pts) dl->AddCircleFilled(p, 2.5f, col);
        draw_x_axis(dl, f, xr, xs);
        draw_y_axis(dl, f, yr, ys, false);
        if (f.hovered && !c.x.empty()) {
            const int k = nearest_point(c, pixel_to_axis(xr, f.mouse.x, f.p0.x, f.p1.x));
            if (k >= 0) {
                const size_t r = c.row[size_t(k)];
                const ImVec2 p(float(axis_to_pixel(xr, c.x[size_t(k)], f.p0.x, f.p1.x)),
                               float(axis_to_pixel(yr, c.y[size_t(k)], f.p1.y, f.p0.y)));
                dl->AddCircle(p, 5, IM_COL32(255, 255, 255, 220));
                const int rk = rc.x.empty() ? -1 : nearest_point(rc, c.x.empty() ? 0 : double(m.steps[r]));
                if (rk >= 0 && rc.x[size_t(rk)] == double(m.steps[r]))
                    ImGui::SetTooltip("%s\n%s %lld, %.3f s\nvalue %.6g\ndense run %lld: %.6g (difference %+.4g)", m.name.c_str(),
                                      metric_x_title(m, false), (long long)m.steps[r], double(m.t_ns[r] - s.t0_ns) * 1e-9, m.values[r],
                                      (long long)s.reference_run, rc.y[size_t(rk)], m.values[r] - rc.y[size_t(rk)]);
                else
                    ImGui::SetTooltip("%s\n%s %lld, %.3f s\nvalue %.6g", m.name.c_str(), metric_x_title(m, false), (long long)m.steps[r],
                                      double(m.t_ns[r] - s.t0_ns) * 1e-9, m.values[r]);
            }
        }
        ImGui::PopID();
    }
    s.shown_plots_scroll_max = ImGui::GetScrollMaxY();
    ImGui::EndChild();
    ImGui::EndGroup();
    ImGui::PopID();
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class MetricsSlot final : public StateSlot<MetricsViewState> {
   public:
    void select(const ViewSelection& sel) override {
        state = {};
        state.run = sel.runs.empty() ? 0 : sel.runs.front();
        // Metrics overlays the per-token loss of every selected run.
        if (sel.runs.size() >= 2) state.overlay_runs.assign(sel.runs.begin() + 1, sel.runs.end());
    }
    bool refresh(storage::SessionReader& r) override { return refresh_metrics(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        (void)t;
        DrawMetricsView(state, size);
    }
};
}  // namespace

ViewEntry metrics_view_entry() {
    return {.name = "metrics", .several_runs = true, .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<MetricsSlot>(); }};
}

}  // namespace kv::views
