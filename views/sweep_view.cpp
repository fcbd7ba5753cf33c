// Sweep view (see sweep_view.h).
#include "views/view_table.h"
#include "views/sweep_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "storage/config_fields.h"
#include "storage/run_experiment.h"
#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

namespace {

bool is_sweep_run(const storage::RunInfo& r) {
    return r.status == storage::RunStatus::DONE && storage::run_evaluates_quality(r.config);
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
    struct Row {
        const storage::RunInfo* run;
        nlohmann::json summary;
        storage::FlatConfig config;
    };
    // Group by task first (each panel picks its own auto metric).
    std::map<std::string, std::vector<Row>> by_task;
    std::vector<std::string> task_order;
    for (const storage::RunInfo& r : runs) {
        if (!is_sweep_run(r)) continue;
        nlohmann::json s = nlohmann::json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
        if (!s.is_object()) continue;
        const std::string task = config_text(r, "data.name");
        if (!by_task.count(task)) task_order.push_back(task);
        by_task[task].push_back({&r, std::move(s), storage::flat_run_config(r.config)});
    }
    std::vector<SweepPanel> panels;
    for (const std::string& task : task_order) {
        auto& rows = by_task[task];
        SweepPanel p;
        p.task = task;
        std::vector<const nlohmann::json*> sums;
        for (const Row& row : rows) sums.push_back(&row.summary);
        p.metric = metric == "auto" || metric.empty() ? auto_metric(sums) : metric;
        // The runs drawn: those that record the metric, dense or with a cache length.
        struct Drawn {
            const Row* row;
            double y, x;  // x 0: a dense reference
        };
        std::vector<Drawn> drawn;
        std::vector<storage::FlatConfig> configs;
        for (const Row& row : rows) {
            double y = 0;
            if (!summary_number(row.summary, p.metric, &y)) continue;
            const std::string name = config_text(*row.run, "kv_cache.name");
            double x = 0;
            if (storage::run_policy(row.run->config) != "dense") {
                x = std::atof(config_text(*row.run, "kv_cache.cache_length").c_str());
                if (!(x > 0)) continue;  // a ratio or token budget: not on this axis
            }
            drawn.push_back({&row, y, x});
            configs.push_back(row.config);
        }
        p.experiment_fields = storage::differing_fields(configs, {"mode", "data.name", "kv_cache.name", "kv_cache.cache_length"});
        // (label, x) -> the runs of that configuration, in id order
        std::map<std::pair<std::string, double>, std::vector<const Drawn*>> cells;
        std::vector<std::pair<std::string, double>> order;
        for (const Drawn& d : drawn) {
            const std::string name = config_text(*d.row->run, "kv_cache.name");
            const std::string exp = storage::experiment_label(d.row->config, p.experiment_fields);
            const std::string base = d.x == 0 && name == "dense-default" ? "dense" : name;
            const auto key = std::make_pair(exp.empty() ? base : base + " | " + exp, d.x);
            if (!cells.count(key)) order.push_back(key);
            cells[key].push_back(&d);
        }
        for (const auto& key : order) {
            const std::vector<const Drawn*>& c = cells[key];
            std::vector<double> ys;
            std::vector<int64_t> ids;
            for (const Drawn* d : c) ys.push_back(d->y), ids.push_back(d->row->run->id);
            std::sort(ids.begin(), ids.end());
            const storage::MeanSe m = storage::mean_and_se(ys);
            const Drawn& newest = **std::max_element(c.begin(), c.end(), [](const Drawn* a, const Drawn* b) { return a->row->run->id < b->row->run->id; });
            const std::string exp = storage::experiment_label(newest.row->config, p.experiment_fields);
            if (m.n > 1) ++p.repeated;
            if (key.second == 0) {
                p.references.push_back({key.first, exp, m.mean, ids.back(), m.se, m.n});
                continue;
            }
            auto it = std::find_if(p.lines.begin(), p.lines.end(), [&](const SweepLine& l) { return l.label == key.first; });
            if (it == p.lines.end()) {
                p.lines.push_back({key.first, config_text(*newest.row->run, "kv_cache.name"), exp, {}});
                it = p.lines.end() - 1;
            }
            it->points.push_back({key.second, m.mean, ids.back(), m.se, m.n, ids, config_text(*newest.row->run, "data.num_samples")});
        }
        for (SweepLine& l : p.lines) std::sort(l.points.begin(), l.points.end(), [](const SweepPoint& a, const SweepPoint& b) { return a.x < b.x; });
        std::sort(p.lines.begin(), p.lines.end(), [](const SweepLine& a, const SweepLine& b) { return a.label < b.label; });
        std::sort(p.references.begin(), p.references.end(), [](const SweepReference& a, const SweepReference& b) { return a.label < b.label; });
        if (!p.lines.empty() || !p.references.empty()) panels.push_back(std::move(p));
    }
    return panels;
}

storage::NeedleGrid sweep_needle_grid(storage::SessionReader& reader) {
    return storage::needle_grid(reader, [](const storage::RunInfo& r) { return storage::run_evaluates_quality(r.config); },
                                [](const storage::RunInfo& r) { return config_text(r, "kv_cache.name"); });
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
        s.needle = sweep_needle_grid(reader);
        if (s.needle.panels.empty()) s.needle_map = false;
        ++s.version;
        return true;
    } catch (const std::exception& e) {
        s.error = e.what();
        return false;
    }
}

namespace {

// The needle grid: one panel per cache side by side (wrapping), rows = depths top to bottom,
// columns = sequence lengths, each cell coloured by the share of needles found and labelled
// with it (grey and blank where no sample), a colour bar under the panels.
void draw_needle_map(const storage::NeedleGrid& g, ImVec2 size) {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float lh = ImGui::GetTextLineHeight();
    const int n = int(g.panels.size());
    const int cols = n <= 3 ? n : (n <= 8 ? 4 : 6);
    const int rows = (n + cols - 1) / cols;
    float left = 0;  // room for the depth labels
    for (double d : g.depths) {
        char t[32];
        std::snprintf(t, sizeof t, "%g", d);
        left = std::max(left, ImGui::CalcTextSize(t).x + 6);
    }
    const float bar = 2 * lh + 8;
    const float pw = (size.x - 12.f * float(cols - 1)) / float(cols);
    const float ph = std::max(80.f, (size.y - bar) / float(rows) - 8.f);
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const Colour text = pack_rgba(210, 210, 215), dim = pack_rgba(160, 160, 165);
    for (int i = 0; i < n; ++i) {
        const storage::NeedleGridPanel& p = g.panels[size_t(i)];
        const float x0 = origin.x + float(i % cols) * (pw + 12.f), y0 = origin.y + float(i / cols) * (ph + 8.f);
        dl->AddText(ImVec2(x0 + left, y0), text, p.title.c_str());
        const float gx0 = x0 + left, gy0 = y0 + lh + 4, gx1 = x0 + pw, gy1 = y0 + ph - lh - 4;
        const float cw = (gx1 - gx0) / float(std::max<size_t>(g.lengths.size(), 1)), ch = (gy1 - gy0) / float(std::max<size_t>(g.depths.size(), 1));
        for (size_t r = 0; r < g.depths.size(); ++r) {
            char t[32];
            std::snprintf(t, sizeof t, "%g", g.depths[r]);
            if (i % cols == 0) dl->AddText(ImVec2(x0, gy0 + ch * (float(r) + 0.5f) - lh * 0.5f), dim, t);
            for (size_t c = 0; c < g.lengths.size(); ++c) {
                const double v = p.values[r][c];
                const ImVec2 a(gx0 + cw * float(c), gy0 + ch * float(r)), b(a.x + cw - 1, a.y + ch - 1);
                dl->AddRectFilled(a, b, std::isnan(v) ? kNoDataColour : colormap(float(v)));
                if (std::isnan(v)) continue;
                char vt[16];
                std::snprintf(vt, sizeof vt, "%.2f", v);
                const ImVec2 ts = ImGui::CalcTextSize(vt);
                if (ts.x < cw - 2 && ts.y < ch - 1)
                    dl->AddText(ImVec2(a.x + (cw - ts.x) * 0.5f, a.y + (ch - ts.y) * 0.5f), v > 0.6 ? pack_rgba(20, 20, 24) : text, vt);
            }
        }
        for (size_t c = 0; c < g.lengths.size(); ++c) {
            const std::string t = std::to_string(g.lengths[c]);
            dl->AddText(ImVec2(gx0 + cw * (float(c) + 0.5f) - ImGui::CalcTextSize(t.c_str()).x * 0.5f, gy1 + 2), dim, t.c_str());
        }
    }
    // The colour bar: 0 .. 1 needles found.
    const float by = origin.y + float(rows) * (ph + 8.f) + 2, bx0 = origin.x + left, bx1 = bx0 + std::min(300.f, size.x - left - 10);
    for (int k = 0; k < 64; ++k)
        dl->AddRectFilled(ImVec2(bx0 + (bx1 - bx0) * float(k) / 64.f, by), ImVec2(bx0 + (bx1 - bx0) * float(k + 1) / 64.f, by + lh * 0.8f),
                          colormap(float(k) / 63.f));
    dl->AddText(ImVec2(bx0, by + lh), dim, "0");
    dl->AddText(ImVec2(bx1 - ImGui::CalcTextSize("1").x, by + lh), dim, "1");
    dl->AddText(ImVec2(bx1 + 8, by), text, "needles found (mean of samples); rows: needle depth, columns: sequence length (tokens)");
    ImGui::Dummy(ImVec2(size.x, float(rows) * (ph + 8.f) + bar));
}

}  // namespace

void DrawSweepView(SweepViewState& s, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) size = ImGui::GetContentRegionAvail();
    const float top = ImGui::GetCursorPosY();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    if (!s.needle.panels.empty()) {
        ImGui::Checkbox("needle heat map (depth x length)", &s.needle_map);
        if (s.needle_map) {
            ImGui::SameLine();
            ImGui::TextDisabled("the grid of kvlab plot --heatmap needle, one panel per cache");
            const float used = ImGui::GetCursorPosY() - top;
            draw_needle_map(s.needle, ImVec2(size.x, size.y - used));
            return;
        }
        ImGui::SameLine();
    }
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
    // What keeps experiments apart, and which points stand for several runs.
    std::set<std::string> fields;
    int repeated = 0;
    for (const SweepPanel& p : s.panels) {
        fields.insert(p.experiment_fields.begin(), p.experiment_fields.end());
        repeated += p.repeated;
    }
    if (!fields.empty()) {
        std::string f;
        for (const std::string& x : fields) f += (f.empty() ? "" : ", ") + x;
        ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1), "Runs differ in %s: each combination is its own line (after \"|\").", f.c_str());
    }
    if (repeated > 0)
        ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.45f, 1), "%d point%s for repeated runs of one configuration: the mean, a bar of +-1 standard error, and n.",
                           repeated, repeated == 1 ? " stands" : "s stand");
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
            for (const SweepPoint& q : l.points)
                xlo = std::min(xlo, q.x), xhi = std::max(xhi, q.x), ylo = std::min(ylo, q.y - q.se), yhi = std::max(yhi, q.y + q.se);
        for (const SweepReference& r : p.references) ylo = std::min(ylo, r.y - r.se), yhi = std::max(yhi, r.y + r.se);
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
        std::vector<float> label_ys;  // reference labels already placed: equal levels stack, never overprint
        for (const SweepReference& r : p.references) {
            const float y = py(r.y);
            float ty = y - ImGui::GetTextLineHeight() - 1;
            while (std::any_of(label_ys.begin(), label_ys.end(), [&](float o) { return std::fabs(o - ty) < ImGui::GetTextLineHeight(); }))
                ty -= ImGui::GetTextLineHeight();
            label_ys.push_back(ty);
            for (float x = f.p0.x; x < f.p1.x; x += 10) dl->AddLine(ImVec2(x, y), ImVec2(std::min(x + 6, f.p1.x), y), IM_COL32(200, 200, 205, 220), 1.5f);
            const std::string text = r.n > 1 ? r.label + " (mean of " + std::to_string(r.n) + " runs)" : r.label;
            dl->AddText(ImVec2(f.p0.x + 4, ty), IM_COL32(200, 200, 205, 220), text.c_str());
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
                const SweepPoint& q = l.points[k];
                if (q.n > 1) {  // error bar (+-1 s.e.) and n
                    const float y0 = py(q.y - q.se), y1 = py(q.y + q.se);
                    dl->AddLine(ImVec2(pts[k].x, y0), ImVec2(pts[k].x, y1), colour_of(l.label), 1.5f);
                    dl->AddLine(ImVec2(pts[k].x - 4, y0), ImVec2(pts[k].x + 4, y0), colour_of(l.label), 1.5f);
                    dl->AddLine(ImVec2(pts[k].x - 4, y1), ImVec2(pts[k].x + 4, y1), colour_of(l.label), 1.5f);
                    const std::string n = "n=" + std::to_string(q.n);
                    dl->AddText(ImVec2(pts[k].x + 6, pts[k].y - ImGui::GetTextLineHeight()), colour_of(l.label), n.c_str());
                }
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
            std::string tip = hit_line->cache + (hit_line->experiment.empty() ? "" : "\n" + hit_line->experiment) + "\nL = " +
                              std::to_string(int64_t(hit->x)) + "\n" + p.metric + " = ";
            char v[96];
            if (hit->n > 1) std::snprintf(v, sizeof v, "%.6g +- %.3g (mean +- s.e. of %d runs)", hit->y, hit->se, hit->n);
            else std::snprintf(v, sizeof v, "%.6g (one run)", hit->y);
            tip += v;
            if (!hit->samples.empty()) tip += "\n" + hit->samples + " sample" + (hit->samples == "1" ? "" : "s") + " per run";
            for (const SweepReference& r : p.references) {  // the dense runs of the same experiment only
                if (r.experiment != hit_line->experiment) continue;
                std::snprintf(v, sizeof v, ": %.6g (difference %+.4g)", r.y, hit->y - r.y);
                tip += "\n" + r.label + v;
            }
            if (hit->n > 1) {
                tip += "\nruns";
                for (int64_t id : hit->runs) tip += " " + std::to_string(id);
                tip += "; click selects the newest, run " + std::to_string(hit->run);
            } else {
                tip += "\nrun " + std::to_string(hit->run) + " (click to select)";
            }
            ImGui::SetTooltip("%s", tip.c_str());
            if (ImGui::IsItemClicked(ImGuiMouseButton_Left)) s.requested_run = s.selected_run = hit->run;
        }
        ImGui::PopID();
    }
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class SweepSlot final : public StateSlot<SweepViewState> {
   public:
    void select(const ViewSelection& sel) override {
        // The whole session, whatever is selected; the selection only marks its points.
        state.selected_run = sel.runs.empty() ? 0 : sel.runs.front();
    }
    bool refresh(storage::SessionReader& r) override { return refresh_sweep(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        (void)t;
        DrawSweepView(state, size);
    }
    void clear(TextureHost* t) override {
        (void)t;
        state = {};
    }
    int64_t take_requested_run() override {
        const int64_t r = state.requested_run;
        state.requested_run = 0;
        return r;
    }
};
}  // namespace

ViewEntry sweep_view_entry() {
    return {.name = "sweep", .several_runs = true, .keeps_several = true, .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<SweepSlot>(); }};
}

}  // namespace kv::views
