// Metrics view (see metrics_view.h).
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

int64_t find_dense_reference(const std::vector<storage::RunInfo>& runs, int64_t run) {
    const auto it = std::find_if(runs.begin(), runs.end(), [&](const storage::RunInfo& r) { return r.id == run; });
    if (it == runs.end()) return 0;
    auto policy = [](const storage::RunInfo& r) {
        return storage::split_cache_name(storage::run_config_value(r.config, "kv_cache.name")).policy;
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

bool refresh_metrics(MetricsViewState& s, storage::SessionReader& reader) {
    try {
        bool any_reference = false;
        if (!s.reference_searched) {
            s.reference_run = find_dense_reference(reader.runs(), s.run);
            s.reference_searched = true;
        }
        if (s.reference_run) {
            for (auto& r : reader.metrics(s.reference_run, "", s.reference_last_id)) {
                s.reference_last_id = std::max(s.reference_last_id, r.id);
                MetricSeries& m = s.reference[r.name];
                m.name = r.name;
                m.ids.push_back(r.id), m.steps.push_back(r.step), m.t_ns.push_back(r.t_ns), m.values.push_back(r.value);
                any_reference = true;
            }
            if (any_reference) ++s.version;
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
        if (!rows.empty()) ++s.version;
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
    for (size_t i = 0; i < s.series.size(); ++i) (metric_is_scalar(s.series[i]) ? scalars : curves).push_back(i);
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
    ImGui::Checkbox("over time", &s.over_time);
    for (size_t i : curves) {
        ImGui::SameLine();
        if (ImGui::GetCursorPosX() + ImGui::CalcTextSize(s.series[i].name.c_str()).x + 40 > size.x) ImGui::NewLine();
        bool shown = std::find(s.hidden.begin(), s.hidden.end(), s.series[i].name) == s.hidden.end();
        ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(series_colour(int(i))));
        if (ImGui::Checkbox(s.series[i].name.c_str(), &shown)) {
            if (shown) s.hidden.erase(std::remove(s.hidden.begin(), s.hidden.end(), s.series[i].name), s.hidden.end());
            else s.hidden.push_back(s.series[i].name);
        }
        ImGui::PopStyleColor();
    }
    std::vector<size_t> visible;
    for (size_t i : curves)
        if (std::find(s.hidden.begin(), s.hidden.end(), s.series[i].name) == s.hidden.end()) visible.push_back(i);
    const float used = ImGui::GetCursorPosY() - top;
    const float each = std::max(70.f, (size.y - used) / std::max<size_t>(1, visible.size()) - ImGui::GetStyle().ItemSpacing.y);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    for (size_t vi = 0; vi < visible.size(); ++vi) {
        const size_t i = visible[vi];
        const MetricSeries& m = s.series[i];
        ImGui::PushID(int(i));
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
        const PlotFrame f = begin_plot_frame("##plot", ImVec2(size.x, each), plot_margins(&xs, &ys, &yr, each));
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
        const Colour col = series_colour(int(i));
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
    ImGui::EndGroup();
    ImGui::PopID();
}

}  // namespace kv::views
