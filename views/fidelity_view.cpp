// Fidelity view (see fidelity_view.h).
#include "views/view_table.h"
#include "views/fidelity_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "storage/config_fields.h"
#include "storage/session_reader.h"
#include "views/colormap.h"

namespace kv::views {

namespace {
constexpr size_t kNumQ = size_t(FidelityQuantity::COUNT);
const char* const kMetricQuantity[kNumQ] = {"attn_rel_error", "kept_mass", "next_token_kl"};
}  // namespace

const char* fidelity_quantity_title(FidelityQuantity q) {
    static const char* const kTitles[kNumQ] = {"attention error vs dense (relative L2)", "kept attention mass",
                                               "next-token KL vs dense (nats)"};
    return size_t(q) < kNumQ ? kTitles[size_t(q)] : "?";
}

bool parse_fidelity_metric(const std::string& name, FidelityQuantity* q, int* layer) {
    const std::string prefix = "fidelity.";
    if (name.rfind(prefix, 0) != 0) return false;
    const std::string rest = name.substr(prefix.size());
    for (size_t k = 0; k < kNumQ; ++k) {
        const std::string qn = kMetricQuantity[k];
        if (rest == qn && FidelityQuantity(k) == FidelityQuantity::NEXT_TOKEN_KL) {
            *q = FidelityQuantity(k);
            *layer = -1;
            return true;
        }
        const std::string lp = qn + ".layer";
        if (rest.rfind(lp, 0) == 0 && rest.size() > lp.size()) {
            const std::string digits = rest.substr(lp.size());
            if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6) return false;
            *q = FidelityQuantity(k);
            *layer = std::atoi(digits.c_str());
            return FidelityQuantity(k) != FidelityQuantity::NEXT_TOKEN_KL;
        }
    }
    return false;
}

double FidelityGrid::at(FidelityQuantity q, int layer, int64_t step) const {
    const std::vector<double>& v = values[size_t(q)];
    const size_t i = size_t(int64_t(layer) * steps + step);
    return layer >= 0 && step >= 0 && step < steps && i < v.size() ? v[i] : NAN;
}

void FidelityGrid::add(FidelityQuantity q, int layer, int64_t step, double value) {
    if (step < 0 || step > (1 << 22)) return;  // not a step a run records; never a huge grid
    if (q == FidelityQuantity::NEXT_TOKEN_KL) layer = 0;
    if (layer < 0 || layer > 4096) return;
    const int new_layers = std::max(layers, q == FidelityQuantity::NEXT_TOKEN_KL ? 0 : layer + 1);
    const int64_t new_steps = std::max(steps, step + 1);
    if (new_layers != layers || new_steps != steps) {
        for (size_t k = 0; k < kNumQ; ++k) {
            const int rows = FidelityQuantity(k) == FidelityQuantity::NEXT_TOKEN_KL ? 1 : new_layers;
            const int old_rows = FidelityQuantity(k) == FidelityQuantity::NEXT_TOKEN_KL ? 1 : layers;
            std::vector<double> g(size_t(int64_t(rows) * new_steps), NAN);
            for (int r = 0; r < old_rows; ++r)
                for (int64_t t = 0; t < steps; ++t)
                    if (size_t(int64_t(r) * steps + t) < values[k].size()) g[size_t(int64_t(r) * new_steps + t)] = values[k][size_t(int64_t(r) * steps + t)];
            values[k] = std::move(g);
        }
        layers = new_layers;
        steps = new_steps;
    }
    values[size_t(q)][size_t(int64_t(layer) * steps + step)] = value;
}

std::vector<double> FidelityGrid::layer_profile(FidelityQuantity q) const {
    const int rows = q == FidelityQuantity::NEXT_TOKEN_KL ? 1 : layers;
    std::vector<double> out(size_t(std::max(rows, 0)), NAN);
    for (int l = 0; l < rows; ++l) {
        double s = 0;
        int64_t n = 0;
        for (int64_t t = 0; t < steps; ++t)
            if (const double v = at(q, l, t); std::isfinite(v)) s += v, ++n;
        if (n) out[size_t(l)] = s / double(n);
    }
    return out;
}

void fidelity_select(FidelityViewState& s, const std::vector<int64_t>& runs) {
    s = {};
    s.runs = runs;
    for (int64_t r : runs) {
        FidelityGrid g;
        g.run = r;
        g.label = "run " + std::to_string(r);
        s.grids.push_back(std::move(g));
    }
}

bool refresh_fidelity(FidelityViewState& s, storage::SessionReader& reader) {
    bool any = false;
    s.error.clear();
    for (FidelityGrid& g : s.grids) {
        try {
            if (g.empty() && !g.run_final) {  // a live run's first rows come when its first sample ends
                const storage::RunInfo info = reader.run(g.run);
                g.fidelity_configured = storage::run_config_value(info.config, "fidelity") == "true";
                g.run_final = storage::run_status_final(info.status);
            }
            if (g.last_id == 0) {
                const storage::RunInfo info = reader.run(g.run);
                const std::string name = storage::run_config_value(info.config, "kv_cache.name");
                const std::string L = storage::run_config_value(info.config, "kv_cache.cache_length");
                g.label = "run " + std::to_string(g.run) + "  " + name + (L.empty() || L == "0" ? "" : "  L=" + L);
            }
            for (const storage::MetricRow& m : reader.metrics(g.run, "", g.last_id)) {
                g.last_id = std::max(g.last_id, m.id);
                FidelityQuantity q;
                int layer = 0;
                if (!parse_fidelity_metric(m.name, &q, &layer)) continue;
                g.add(q, layer, m.step, m.value);
                any = true;
            }
        } catch (const std::exception& e) {
            s.error = e.what();
        }
    }
    if (any) ++s.version;
    return any;
}

namespace {

// Value range of a quantity over every shown run (shared colour scale), finite values only.
bool quantity_range(const FidelityViewState& s, FidelityQuantity q, double* lo, double* hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (const FidelityGrid& g : s.grids)
        for (double v : g.values[size_t(q)])
            if (std::isfinite(v)) *lo = std::min(*lo, v), *hi = std::max(*hi, v);
    if (!(*lo <= *hi)) return false;
    // Mass reads against its ideal 1, error and KL against 0: anchor the scale there so an exact
    // run is one flat colour at the scale's end, not a stretched noise pattern.
    if (q == FidelityQuantity::KEPT_MASS) *hi = 1;
    else *lo = 0;
    if (*hi <= *lo) *hi = *lo + (q == FidelityQuantity::KEPT_MASS ? 0 : 1e-9), *lo = std::min(*lo, *hi - 1e-9);
    return true;
}

// One heatmap of `rows` x g.steps cells into [p0, p1); hover -> tooltip. Mass is drawn with
// the map reversed (low mass = bright = bad, like high error), so bright always means "lost".
void draw_heatmap(ImDrawList* dl, const FidelityGrid& g, FidelityQuantity q, ImVec2 p0, ImVec2 p1, double lo, double hi) {
    const int rows = q == FidelityQuantity::NEXT_TOKEN_KL ? 1 : g.layers;
    if (rows <= 0 || g.steps <= 0) return;
    const float cw = (p1.x - p0.x) / float(g.steps), ch = (p1.y - p0.y) / float(rows);
    const bool reverse = q == FidelityQuantity::KEPT_MASS;
    for (int l = 0; l < rows; ++l)
        for (int64_t t = 0; t < g.steps; ++t) {
            const double v = g.at(q, l, t);
            const float u = std::isfinite(v) ? float((v - lo) / (hi - lo)) : NAN;
            const Colour c = std::isfinite(v) ? colormap(reverse ? 1.f - u : u) : kNoDataColour;
            // Layer 0 at the top, as in the eviction map's layer list.
            const ImVec2 a(p0.x + float(t) * cw, p0.y + float(l) * ch);
            dl->AddRectFilled(a, ImVec2(a.x + cw + 0.5f, a.y + ch + 0.5f), c);
        }
    const ImVec2 m = ImGui::GetIO().MousePos;
    if (m.x >= p0.x && m.x < p1.x && m.y >= p0.y && m.y < p1.y && ImGui::IsWindowHovered()) {
        const int64_t t = std::clamp<int64_t>(int64_t((m.x - p0.x) / cw), 0, g.steps - 1);
        const int l = std::clamp(int((m.y - p0.y) / ch), 0, rows - 1);
        dl->AddRect(ImVec2(p0.x + float(t) * cw, p0.y + float(l) * ch), ImVec2(p0.x + float(t + 1) * cw, p0.y + float(l + 1) * ch),
                    IM_COL32(255, 255, 255, 230));
        const double v = g.at(q, l, t);
        if (q == FidelityQuantity::NEXT_TOKEN_KL)
            ImGui::SetTooltip("%s\nchunk %lld\n%s: %.6g", g.label.c_str(), (long long)t, fidelity_quantity_title(q), v);
        else
            ImGui::SetTooltip("%s\nlayer %d, chunk %lld\n%s: %.6g\nlayer mean: %.6g", g.label.c_str(), l, (long long)t,
                              fidelity_quantity_title(q), v, g.layer_profile(q)[size_t(l)]);
    }
}

void draw_profile(ImDrawList* dl, const FidelityViewState& s, ImVec2 size) {
    // Per-layer means of the error and of the lost mass (1 - kept), one line per run.
    const FidelityQuantity qs[2] = {FidelityQuantity::ATTN_ERROR, FidelityQuantity::KEPT_MASS};
    const char* titles[2] = {"per layer: attention error (mean over chunks)", "per layer: lost attention mass 1 - kept (mean over chunks)"};
    for (int k = 0; k < 2; ++k) {
        int layers = 0;
        double hi = 0;
        std::vector<std::vector<double>> prof;
        for (const FidelityGrid& g : s.grids) {
            std::vector<double> p = g.layer_profile(qs[k]);
            if (k == 1)
                for (double& v : p) v = 1 - v;
            for (double v : p)
                if (std::isfinite(v)) hi = std::max(hi, v);
            layers = std::max(layers, int(p.size()));
            prof.push_back(std::move(p));
        }
        if (layers == 0) return;
        const AxisRange xr{-0.5, double(layers) - 0.5}, yr{0, hi > 0 ? hi * 1.08 : 1};
        const AxisSpec xs{AxisUnit::INTEGER, "layer"}, ys{AxisUnit::NUMBER, titles[k]};
        ImGui::PushID(k);
        const PlotFrame f = begin_plot_frame("##profile", ImVec2(size.x * 0.5f - 4, size.y), plot_margins(&xs, &ys, &yr, size.y));
        dl->AddRectFilled(f.p0, f.p1, IM_COL32(26, 26, 30, 255));
        for (size_t r = 0; r < prof.size(); ++r) {
            std::vector<ImVec2> pts;
            for (size_t l = 0; l < prof[r].size(); ++l)
                if (std::isfinite(prof[r][l]))
                    pts.push_back(ImVec2(float(axis_to_pixel(xr, double(l), f.p0.x, f.p1.x)), float(axis_to_pixel(yr, prof[r][l], f.p1.y, f.p0.y))));
            if (pts.size() > 1) dl->AddPolyline(pts.data(), int(pts.size()), series_colour(int(r)), 0, 1.5f);
            for (const ImVec2& p : pts) dl->AddCircleFilled(p, 2.5f, series_colour(int(r)));
        }
        draw_x_axis(dl, f, xr, xs);
        draw_y_axis(dl, f, yr, ys, false);
        if (f.hovered) {
            const int l = std::clamp(int(std::lround(pixel_to_axis(xr, f.mouse.x, f.p0.x, f.p1.x))), 0, layers - 1);
            std::string tip = "layer " + std::to_string(l);
            for (size_t r = 0; r < prof.size(); ++r) {
                char line[160];
                std::snprintf(line, sizeof line, "\n%s: %.5g", s.grids[r].label.c_str(), l < int(prof[r].size()) ? prof[r][size_t(l)] : NAN);
                tip += line;
            }
            ImGui::SetTooltip("%s", tip.c_str());
        }
        ImGui::PopID();
        if (k == 0) ImGui::SameLine();
    }
}

}  // namespace

std::string fidelity_empty_message(const FidelityViewState& s) {
    for (const FidelityGrid& g : s.grids)
        if (g.fidelity_configured && !g.run_final)
            return "recording fidelity: run " + std::to_string(g.run) +
                   " measures against the dense cache; its numbers appear as each sample ends";
    for (const FidelityGrid& g : s.grids)
        if (g.fidelity_configured) return "run " + std::to_string(g.run) + " had fidelity on but ended before its first sample did: nothing recorded";
    return "no fidelity recorded: launch the run with --fidelity true (eval_long)";
}

void DrawFidelityView(FidelityViewState& s, ImVec2 size) {
    if (size.x <= 0 || size.y <= 0) size = ImGui::GetContentRegionAvail();
    if (!s.error.empty()) ImGui::TextColored(ImVec4(1, 0.5f, 0.4f, 1), "%s", s.error.c_str());
    bool any = false;
    for (const FidelityGrid& g : s.grids) any = any || !g.empty();
    if (!any) {
        draw_empty_state(fidelity_empty_message(s).c_str());
        return;
    }
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float top = ImGui::GetCursorPosY();
    ImGui::TextDisabled("layer x chunk against the dense cache; bright = more lost. Hover a cell for its value.");
    // Shared colour scales over every shown run, one bar per quantity at the right.
    double lo[kNumQ], hi[kNumQ];
    bool have[kNumQ];
    float bar_w = 0;
    for (size_t k = 0; k < kNumQ; ++k) {
        have[k] = quantity_range(s, FidelityQuantity(k), &lo[k], &hi[k]);
        if (have[k]) bar_w = std::max(bar_w, colour_bar_width(lo[k], hi[k], AxisUnit::NUMBER, fidelity_quantity_title(FidelityQuantity(k))));
    }
    bar_w = std::max(bar_w, 70.f);
    const float profile_h = std::max(120.f, size.y * 0.28f);
    const float label_h = ImGui::GetTextLineHeightWithSpacing();
    const float avail_h = size.y - (ImGui::GetCursorPosY() - top) - profile_h - 2 * label_h - 16;
    const float kl_h = 16.f;
    const float map_h = std::max(40.f, (avail_h - kl_h - 4 * label_h - 12) / 2.f);
    const int n = int(s.grids.size());
    const float gap = 10.f, left = 40.f;
    const float col_w = std::max(60.f, (size.x - bar_w - left - gap * float(n)) / float(std::max(n, 1)));
    const ImVec2 origin = ImGui::GetCursorScreenPos();
    const FidelityQuantity order[3] = {FidelityQuantity::ATTN_ERROR, FidelityQuantity::KEPT_MASS, FidelityQuantity::NEXT_TOKEN_KL};
    // A row with each run's label, then per quantity a short title row and its map.
    float y = origin.y + label_h;
    float rows_y[3], rows_h[3];
    for (int k = 0; k < 3; ++k) {
        rows_y[k] = y + label_h;
        rows_h[k] = order[k] == FidelityQuantity::NEXT_TOKEN_KL ? kl_h : map_h;
        y = rows_y[k] + rows_h[k] + 4;
    }
    static const char* const kShort[kNumQ] = {"attention error (relative L2)", "kept attention mass", "next-token KL (nats)"};
    ImFont* font = ImGui::GetFont();
    const float fs = ImGui::GetFontSize();
    auto clipped_text = [&](ImVec2 at, float width, Colour c, const char* text) {
        const ImVec4 clip(at.x, at.y, at.x + width, at.y + label_h);
        dl->AddText(font, fs, at, c, text, nullptr, 0.f, &clip);
    };
    for (int r = 0; r < n; ++r) {
        const FidelityGrid& g = s.grids[size_t(r)];
        const float x0 = origin.x + left + float(r) * (col_w + gap);
        clipped_text(ImVec2(x0, origin.y + 2), col_w, series_colour(r), g.label.c_str());
        for (int k = 0; k < 3; ++k) {
            const FidelityQuantity q = order[k];
            clipped_text(ImVec2(x0, rows_y[k] - label_h + 2), col_w, IM_COL32(200, 200, 205, 255), kShort[size_t(q)]);
            const ImVec2 p0(x0, rows_y[k]), p1(x0 + col_w, rows_y[k] + rows_h[k]);
            if (!have[size_t(q)] || g.values[size_t(q)].empty()) {
                dl->AddRectFilled(p0, p1, kNoDataColour);
                dl->AddText(ImVec2(p0.x + 4, p0.y + 1), IM_COL32(150, 150, 155, 255), "not recorded");
                continue;
            }
            draw_heatmap(dl, g, q, p0, p1, lo[size_t(q)], hi[size_t(q)]);
            if (r == 0 && q != FidelityQuantity::NEXT_TOKEN_KL) {
                // Layer ticks at the left of the first column: first, middle, last.
                for (int l : {0, g.layers / 2, g.layers - 1}) {
                    const float ly = p0.y + (float(l) + 0.5f) * (p1.y - p0.y) / float(std::max(g.layers, 1)) - ImGui::GetTextLineHeight() * 0.5f;
                    char lt[16];
                    std::snprintf(lt, sizeof lt, "L%d", l);
                    dl->AddText(ImVec2(origin.x, ly), IM_COL32(170, 170, 175, 255), lt);
                }
            }
        }
        char foot[96];
        std::snprintf(foot, sizeof foot, "chunks 0 .. %lld", (long long)(g.steps - 1));
        clipped_text(ImVec2(x0, y), col_w, IM_COL32(170, 170, 175, 255), foot);
    }
    // Colour bars: error and mass beside their rows (mass reversed, as drawn), KL beside the maps' foot.
    const float bx = origin.x + left + float(n) * (col_w + gap);
    for (int k = 0; k < 2; ++k) {
        const FidelityQuantity q = order[k];
        if (!have[size_t(q)]) continue;
        const bool rev = q == FidelityQuantity::KEPT_MASS;
        draw_colour_bar(dl, ImVec2(bx, rows_y[k]), ImVec2(bx + bar_w, rows_y[k] + rows_h[k]), lo[size_t(q)], hi[size_t(q)], AxisUnit::NUMBER,
                        nullptr, false, rev ? 1.f : 0.f, rev ? 0.f : 1.f);  // the row's label names it
    }
    if (have[size_t(FidelityQuantity::NEXT_TOKEN_KL)]) {
        // The KL strip is too thin for a bar: its range as text beside it.
        char kl[64];
        std::snprintf(kl, sizeof kl, "0 .. %.3g", hi[size_t(FidelityQuantity::NEXT_TOKEN_KL)]);
        clipped_text(ImVec2(bx + 4, rows_y[2]), bar_w, IM_COL32(200, 200, 205, 255), kl);
    }
    ImGui::Dummy(ImVec2(size.x, y - origin.y + label_h + 6));
    draw_profile(dl, s, ImVec2(size.x, profile_h));
}

// ---- its entry in the view table -----------------------------------------------------------

namespace {
class FidelitySlot final : public StateSlot<FidelityViewState> {
   public:
    void select(const ViewSelection& sel) override {
        fidelity_select(state, sel.runs);  // every selected run, side by side
    }
    bool refresh(storage::SessionReader& r) override { return refresh_fidelity(state, r); }
    void draw(TextureHost* t, ImVec2 size) override {
        (void)t;
        DrawFidelityView(state, size);
    }
};
}  // namespace

ViewEntry fidelity_view_entry() {
    return {.name = "fidelity", .several_runs = true, .keeps_several = true, .make = []() -> std::unique_ptr<ViewSlot> { return std::make_unique<FidelitySlot>(); }};
}

}  // namespace kv::views
