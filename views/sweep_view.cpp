// Sweep view (see sweep_view.h).
#include "views/sweep_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "storage/config_fields.h"
#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

namespace {

bool is_sweep_run(const storage::RunInfo& r) {
    return r.status == storage::RunStatus::DONE && storage::run_config_value(r.config, "mode") == "eval_long";
}

std::string config_text(const storage::RunInfo& r, const char* key) { return storage::run_config_value(r.config, key); }

bool summary_number(const nlohmann::json& s, const std::string& key, double* out) {
    if (!s.is_object() || !s.contains(key) || !s[key].is_number()) return false;
    *out = s[key].get<double>();
    return std::isfinite(*out);
}

// As `kvlab sweep`'s auto metric: perplexity, else copy_token_accuracy, else accuracy, else mean_loss.
std::string auto_metric(const std::vector<const nlohmann::json*>& sums) {
    for (const char* m : {"perplexity", "copy_token_accuracy", "accuracy", "mean_loss"})
        for (const nlohmann::json* s : sums)
            if (s->is_object() && s->contains(m)) return m;
    return "mean_loss";
}

}  // namespace

std::vector<std::string> sweep_metrics(const std::vector<storage::RunInfo>& runs) {
    std::set<std::string> names;
    for (const storage::RunInfo& r : runs) {
        if (!is_sweep_run(r)) continue;
        const nlohmann::json s = nlohmann::json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
        if (!s.is_object()) continue;
        for (auto it = s.begin(); it != s.end(); ++it)
            if (it.value().is_number() && it.key() != "samples" && it.key() != "chunks_per_sample") names.insert(it.key());
    }
    return {names.begin(), names.end()};
}

std::vector<SweepPanel> sweep_panels(const std::vector<storage::RunInfo>& runs, const std::string& metric) {
    // Group by task first (each panel picks its own auto metric).
    std::map<std::string, std::vector<std::pair<const storage::RunInfo*, nlohmann::json>>> by_task;
    std::vector<std::string> task_order;
    for (const storage::RunInfo& r : runs) {
        if (!is_sweep_run(r)) continue;
        nlohmann::json s = nlohmann::json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
        if (!s.is_object()) continue;
        const std::string task = config_text(r, "data.name");
        if (!by_task.count(task)) task_order.push_back(task);
        by_task[task].push_back({&r, std::move(s)});
    }
    std::vector<SweepPanel> panels;
    for (const std::string& task : task_order) {
        auto& rows = by_task[task];
        SweepPanel p;
        p.task = task;
        std::vector<const nlohmann::json*> sums;
        for (auto& [r, s] : rows) sums.push_back(&s);
        p.metric = metric == "auto" || metric.empty() ? auto_metric(sums) : metric;
        for (auto& [r, s] : rows) {  // runs come in id order: a later run of the same cell wins
            double y = 0;
            if (!summary_number(s, p.metric, &y)) continue;
            const std::string name = config_text(*r, "kv_cache.name");
            if (storage::split_cache_name(name).policy == "dense") {
                const std::string label = name == "dense-default" ? "dense" : name;
                auto it = std::find_if(p.references.begin(), p.references.end(), [&](const SweepReference& x) { return x.label == label; });
                if (it == p.references.end()) p.references.push_back({label, y, r->id});
                else it->y = y, it->run = r->id;
                continue;
            }
            const double L = std::atof(config_text(*r, "kv_cache.cache_length").c_str());
            if (!(L > 0)) continue;  // a ratio or token budget: not on this axis
            auto it = std::find_if(p.lines.begin(), p.lines.end(), [&](const SweepLine& l) { return l.label == name; });
            if (it == p.lines.end()) {
                p.lines.push_back({name, {}});
                it = p.lines.end() - 1;
            }
            auto pt = std::find_if(it->points.begin(), it->points.end(), [&](const SweepPoint& q) { return q.x == L; });
            if (pt == it->points.end()) it->points.push_back({L, y, r->id});
            else *pt = {L, y, r->id};
        }
        for (SweepLine& l : p.lines) std::sort(l.points.begin(), l.points.end(), [](const SweepPoint& a, const SweepPoint& b) { return a.x < b.x; });
        std::sort(p.lines.begin(), p.lines.end(), [](const SweepLine& a, const SweepLine& b) { return a.label < b.label; });
        if (!p.lines.empty() || !p.references.empty()) panels.push_back(std::move(p));
    }
    return panels;
}

bool refresh_sweep(SweepViewState& s, storage::SessionReader& reader) {
    try {
        std::vector<storage::RunInfo> runs = reader.runs();
        size_t done = 0;
        int64_t last = 0;
        for (const storage::RunInfo& r : runs)
            if (r.status == storage::RunStatus::DONE) ++done, last = std::max(last, r.finished_ms);
        s.error.clear();
        if (done == s.runs_seen && last == s.last_finished_ms && s.version > 0) return false;
        s.runs_seen = done;
        s.last_finished_ms = last;
        s.runs = std::move(runs);
        s.panels = sweep_panels(s.runs, s.metric);
        s.metrics = sweep_metrics(s.runs);
        ++s.version;
        return true;
    } catch (const std::exception& e) {
        s.error = e.what();
        return false;
    }
}

void DrawSweepView(SweepViewState& s, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) size = ImGui::GetContentRegionAvail();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    // Metric menu: auto and every numeric summary key the done runs record.
    ImGui::SetNextItemWidth(260);
    if (ImGui::BeginCombo("y metric", s.metric.c_str())) {
        std::vector<std::string> items = {"auto"};
        items.insert(items.end(), s.metrics.begin(), s.metrics.end());
        for (const std::string& m : items)
            if (ImGui::Selectable(m.c_str(), m == s.metric) && m != s.metric) {
                s.metric = m;
                s.panels = sweep_panels(s.runs, s.metric);
                ++s.version;
            }
        ImGui::EndCombo();
    }
    ImGui::SameLine();
    ImGui::TextDisabled("x: cache length L (slots per layer, log2); dashed: dense. Click a point to select its run.");
    if (s.panels.empty()) {
        draw_empty_state("no finished eval_long runs with a cache length yet (kvlab sweep, or Compare policies... with cache sizes)");
        return;
    }
    // One label per cache across panels, same colour everywhere.
    std::vector<std::string> labels;
    for (const SweepPanel& p : s.panels)
        for (const SweepLine& l : p.lines)
            if (std::find(labels.begin(), labels.end(), l.label) == labels.end()) labels.push_back(l.label);
    std::sort(labels.begin(), labels.end());
    auto colour_of = [&](const std::string& l) {
        return series_colour(int(std::find(labels.begin(), labels.end(), l) - labels.begin()));
    };
    ImDrawList* dl = ImGui::GetWindowDrawList();
    std::vector<LegendEntry> legend;
    for (const std::string& l : labels) legend.push_back({colour_of(l), l});
    legend.push_back({pack_rgba(200, 200, 205), "dense (reference)"});
    const ImVec2 at = ImGui::GetCursorScreenPos();
    const float lh = legend_height(size.x, legend);
    draw_legend(dl, at, at.x + size.x, legend);
    ImGui::Dummy(ImVec2(size.x, lh));
    const int n = int(s.panels.size());
    const int cols = n <= 2 ? n : (n <= 4 ? 2 : 3);
    const int rows = (n + cols - 1) / cols;
    const float used = ImGui::GetCursorPosY() - top;
    const float pw = (size.x - 8.f * float(cols - 1)) / float(cols), ph = std::max(120.f, (size.y - used) / float(rows) - 8.f);
    for (int i = 0; i < n; ++i) {
        SweepPanel& p = s.panels[size_t(i)];
        double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
        for (const SweepLine& l : p.lines)
            for (const SweepPoint& q : l.points) xlo = std::min(xlo, q.x), xhi = std::max(xhi, q.x), ylo = std::min(ylo, q.y), yhi = std::max(yhi, q.y);
        for (const SweepReference& r : p.references) ylo = std::min(ylo, r.y), yhi = std::max(yhi, r.y);
        if (!(xlo <= xhi)) xlo = 1, xhi = 2;
        if (!(ylo <= yhi)) ylo = 0, yhi = 1;
        const double lx0 = std::log2(xlo) - 0.3, lx1 = std::log2(xhi) + 0.3;
        const double ypad = yhi > ylo ? (yhi - ylo) * 0.08 : std::max(0.05, std::fabs(yhi) * 0.1);
        const AxisRange xr{lx0, lx1}, yr{ylo - ypad, yhi + ypad};
        char title[200];
        std::snprintf(title, sizeof title, "%s: %s", p.task.c_str(), p.metric.c_str());
        const AxisSpec xs{AxisUnit::NUMBER, "log2 cache length L"}, ys{AxisUnit::NUMBER, title};
        if (i % cols) ImGui::SameLine();
        ImGui::PushID(i);
        const PlotFrame f = begin_plot_frame("##sweep", ImVec2(pw, ph), plot_margins(&xs, &ys, &yr, ph));
        dl->AddRectFilled(f.p0, f.p1, IM_COL32(26, 26, 30, 255));
        auto px = [&](double x) { return float(axis_to_pixel(xr, std::log2(x), f.p0.x, f.p1.x)); };
        auto py = [&](double y) { return float(axis_to_pixel(yr, y, f.p1.y, f.p0.y)); };
        for (const SweepReference& r : p.references) {
            const float y = py(r.y);
            for (float x = f.p0.x; x < f.p1.x; x += 10) dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + 6, f.p1.x), y), IM_COL32(200, 200, 205, 220), 1.5f);
            dl->AddText(ImVec2(f.p0.x + 4, y - ImGui::GetTextLineHeight() - 1), IM_COL32(200, 200, 205, 220), r.label.c_str());
        }
        // The nearest point under the mouse (within 10 px): tooltip, and a click selects its run.
        const SweepPoint* hit = nullptr;
        const SweepLine* hit_line = nullptr;
        float best = 100.f;
        for (const SweepLine& l : p.lines) {
            std::vector<ImVec2> pts;
            for (const SweepPoint& q : l.points) pts.push_back(ImVec2(px(q.x), py(q.y)));
            if (pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), colour_of(l.label), 0, 2.f);
            for (size_t k = 0; k < pts.size(); ++k) {
                dl->AddCircleFilled(pts[k], 3.5f, colour_of(l.label));
                if (l.points[k].run == s.selected_run) dl->AddCircle(pts[k], 7.f, IM_COL32(255, 255, 255, 255), 0, 2.f);
                const float dx = pts[k].x - f.mouse.x, dy = pts[k].y - f.mouse.y;
                if (f.hovered && dx * dx + dy * dy < best) best = dx * dx + dy * dy, hit = &l.points[k], hit_line = &l;
            }
        }
        // x ticks at the powers of two the runs used.
        std::set<double> xsu;
        for (const SweepLine& l : p.lines)
            for (const SweepPoint& q : l.points) xsu.insert(q.x);
        for (double x : xsu) {
            char t[32];
            std::snprintf(t, sizeof t, "%g", x);
            const float X = px(x);
            dl->AddLine(ImVec2(X, f.p1.y), ImVec2(X, f.p1.y + 4), IM_COL32(170, 170, 175, 255));
            dl->AddText(ImVec2(X - ImGui::CalcTextSize(t).x * 0.5f, f.p1.y + 5), IM_COL32(170, 170, 175, 255), t);
        }
        draw_y_axis(dl, f, yr, ys, false);
        dl->AddText(ImVec2(f.p0.x + (f.width() - ImGui::CalcTextSize("cache length L (slots per layer)").x) * 0.5f, f.outer1.y - ImGui::GetTextLineHeight() - 2),
                    IM_COL32(200, 200, 205, 255), "cache length L (slots per layer)");
        if (hit) {
            dl->AddCircle(ImVec2(px(hit->x), py(hit->y)), 6.f, IM_COL32(255, 255, 255, 230));
            std::string tip = hit_line->label + "\nL = " + std::to_string(int64_t(hit->x)) + "\n" + p.metric + " = ";
            char v[64];
            std::snprintf(v, sizeof v, "%.6g", hit->y);
            tip += v;
            for (const SweepReference& r : p.references) {
                std::snprintf(v, sizeof v, "\n%s: %.6g (difference %+.4g)", r.label.c_str(), r.y, hit->y - r.y);
                tip += v;
            }
            tip += "\nrun " + std::to_string(hit->run) + " (click to select)";
            ImGui::SetTooltip("%s", tip.c_str());
            if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) s.requested_run = s.selected_run = hit->run;
        }
        ImGui::PopID();
    }
}

}  // namespace kv::views
