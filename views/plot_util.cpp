// Plot helpers (see plot_util.h).
#include "views/plot_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "views/colormap.h"

namespace kv::views {

void AxisRange::zoom(double anchor, double factor, double min_span) {
    double nlo = anchor - (anchor - lo) * factor, nhi = anchor + (hi - anchor) * factor;
    if (nhi - nlo < min_span) {
        const double mid = 0.5 * (nlo + nhi);
        nlo = mid - 0.5 * min_span, nhi = mid + 0.5 * min_span;
    }
    lo = nlo, hi = nhi;
}

void AxisRange::clamp_to(double min, double max) {
    if (!(max > min)) return;
    if (hi - lo >= max - min) {
        lo = min, hi = max;
        return;
    }
    if (lo < min) hi += min - lo, lo = min;
    if (hi > max) lo -= hi - max, hi = max;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
    std::vector<double> out;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || target < 1) return out;
    const double raw = (hi - lo) / target;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9 && out.size() < 64; v += step)
        out.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    return out;
}

namespace {
// Text of v / unit with as many decimals as the step needs (step 0.25 -> 2, 200 -> 0).
std::string tick_text(double v, double step_in_unit, const char* suffix) {
    int decimals = 0;
    if (step_in_unit > 0 && step_in_unit < 1) {
        decimals = int(std::ceil(-std::log10(step_in_unit) - 1e-9));
        // 0.25 needs two decimals although log10 says one
        const double scaled = step_in_unit * std::pow(10.0, decimals);
        if (std::fabs(scaled - std::round(scaled)) > 1e-6) ++decimals;
    }
    if (std::fabs(v) < step_in_unit * 1e-6) v = 0;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f%s", std::clamp(decimals, 0, 9), v, suffix);
    return buf;
}
}  // namespace

std::string axis_value_text(AxisUnit unit, double v) {
    char buf[48];
    switch (unit) {
        case AxisUnit::BYTES: return format_bytes(v);
        case AxisUnit::NANOSECONDS:
        case AxisUnit::SECONDS: {
            const double ns = unit == AxisUnit::SECONDS ? v * 1e9 : v, a = std::fabs(ns);
            if (a >= 1e9) std::snprintf(buf, sizeof buf, "%.3g s", ns / 1e9);
            else if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.3g ms", ns / 1e6);
            else if (a >= 1e3) std::snprintf(buf, sizeof buf, "%.3g us", ns / 1e3);
            else std::snprintf(buf, sizeof buf, "%.3g ns", ns);
            return buf;
        }
        case AxisUnit::NUMBER:
        case AxisUnit::INTEGER:
        case AxisUnit::COUNT: break;
    }
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

AxisTicks axis_ticks(AxisUnit unit, double lo, double hi, int target) {
    AxisTicks t;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return t;
    const double mag = std::max(std::fabs(lo), std::fabs(hi));
    const char* suffix = "";
    double u = 1;
    switch (unit) {
        case AxisUnit::BYTES: {
            static const char* const kNames[] = {" B", " KiB", " MiB", " GiB", " TiB"};
            int k = 0;
            while (k < 4 && mag >= std::pow(1024.0, k + 1)) ++k;
            u = std::pow(1024.0, k), suffix = kNames[k];
            break;
        }
        case AxisUnit::NANOSECONDS:
        case AxisUnit::SECONDS: {
            const double ns = unit == AxisUnit::SECONDS ? 1e9 : 1.0;  // ns per data unit
            const double mag_ns = mag * (unit == AxisUnit::SECONDS ? 1e9 : 1.0);
            double unit_ns = 1;
            suffix = " ns";
            if (mag_ns >= 1e9) unit_ns = 1e9, suffix = " s";
            else if (mag_ns >= 1e6) unit_ns = 1e6, suffix = " ms";
            else if (mag_ns >= 1e3) unit_ns = 1e3, suffix = " us";
            u = unit_ns / ns;
            break;
        }
        case AxisUnit::NUMBER:
        case AxisUnit::INTEGER:
        case AxisUnit::COUNT: {
            // Big counts print as 20k / 1.5M, once the step is a whole number of thousands.
            const std::vector<double> probe = nice_ticks(lo, hi, target);
            const double step = probe.size() > 1 ? probe[1] - probe[0] : 0;
            if (mag >= 1e7 && step >= 1e5) u = 1e6, suffix = "M";
            else if (mag >= 1e4 && step >= 100) u = 1e3, suffix = "k";
            break;
        }
    }
    std::vector<double> ticks = nice_ticks(lo / u, hi / u, target);
    if (unit == AxisUnit::INTEGER && u == 1 && ticks.size() > 1 && ticks[1] - ticks[0] < 1) {
        ticks.clear();  // whole numbers only: a step of 1
        for (double v = std::ceil(lo); v <= hi + 1e-9 && ticks.size() < 64; v += 1) ticks.push_back(v);
    }
    if (ticks.empty()) return t;
    const double step = ticks.size() > 1 ? ticks[1] - ticks[0] : std::max(1e-12, (hi - lo) / u);
    t.unit = u;
    t.step = step * u;
    for (double v : ticks) {
        t.values.push_back(v * u);
        t.labels.push_back(tick_text(v, step, suffix));
    }
    return t;
}

std::string format_bytes(double b) {
    char buf[48];
    const double a = std::fabs(b);
    if (a < 1024) std::snprintf(buf, sizeof buf, "%.0f B", b);
    else if (a < 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
    else if (a < 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024));
    else std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    return buf;
}

std::string format_duration_ns(double ns) {
    char buf[48];
    const double a = std::fabs(ns);
    if (a < 1e3) std::snprintf(buf, sizeof buf, "%.0f ns", ns);
    else if (a < 1e6) std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
    else if (a < 1e9) std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
    else std::snprintf(buf, sizeof buf, "%.3f s", ns / 1e9);
    return buf;
}

std::string format_count(double v) {
    char buf[48];
    const double a = std::fabs(v);
    if (a >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
    else if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
    else if (a >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
    else if (a >= 100 || v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f", v);
    else std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

// ---- ImGui helpers ------------------------------------------------------------------------
PlotFrame begin_plot_frame(const char* id, ImVec2 size) {
    PlotFrame f;
    size.x = std::max(size.x, 8.f);
    size.y = std::max(size.y, 8.f);
    f.p0 = ImGui::GetCursorScreenPos();
    ImGui::InvisibleButton(id, size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
    f.p1 = ImVec2(f.p0.x + size.x, f.p0.y + size.y);
    f.hovered = ImGui::IsItemHovered();
    f.active = ImGui::IsItemActive();
    f.mouse = ImGui::GetIO().MousePos;
    return f;
}

PlotMargins plot_margins(const AxisSpec* x, const AxisSpec* y, const AxisRange* y_range, float outer_height, float right) {
    const float line = ImGui::GetTextLineHeight();
    PlotMargins m;
    m.right = right;
    m.top = y && y->title ? line + 2 : 4;
    m.bottom = x ? line + 6 + (x->title ? line + 2 : 0) : 4;
    m.left = 6;
    if (y && y_range) {
        const AxisTicks t = axis_ticks(y->unit, y_range->lo, y_range->hi, y_tick_target(outer_height - m.top - m.bottom));
        float widest = 0;
        for (const auto& l : t.labels) widest = std::max(widest, ImGui::CalcTextSize(l.c_str()).x);
        m.left = widest + 12;
    }
    return m;
}

PlotFrame begin_plot_frame(const char* id, ImVec2 size, const PlotMargins& m) {
    size.x = std::max(size.x, m.left + m.right + 8.f);
    size.y = std::max(size.y, m.top + m.bottom + 8.f);
    const ImVec2 outer0 = ImGui::GetCursorScreenPos();
    ImGui::SetCursorScreenPos(ImVec2(outer0.x + m.left, outer0.y + m.top));
    PlotFrame f = begin_plot_frame(id, ImVec2(size.x - m.left - m.right, size.y - m.top - m.bottom));
    // The whole outer rectangle is the item the layout continues after.
    ImGui::SetCursorScreenPos(outer0);
    ImGui::Dummy(size);
    f.outer0 = outer0;
    f.outer1 = ImVec2(outer0.x + size.x, outer0.y + size.y);
    return f;
}

int x_tick_target(float width_px) { return std::max(2, int(width_px / 90)); }
int y_tick_target(float height_px) { return std::max(2, int(height_px / (2.6f * ImGui::GetTextLineHeight()))); }

namespace {
constexpr ImU32 kAxisText = IM_COL32(210, 210, 210, 235);
constexpr ImU32 kAxisTitle = IM_COL32(235, 235, 235, 255);
constexpr ImU32 kTickColour = IM_COL32(200, 200, 200, 170);
}  // namespace

void draw_x_axis(ImDrawList* dl, const PlotFrame& f, const AxisRange& x, const AxisSpec& spec) {
    const AxisTicks t = axis_ticks(spec.unit, x.lo, x.hi, x_tick_target(f.width()));
    float last_right = -1e30f;
    for (size_t i = 0; i < t.values.size(); ++i) {
        const float px = float(axis_to_pixel(x, t.values[i], f.p0.x, f.p1.x));
        if (px < f.p0.x - 0.5f || px > f.p1.x + 0.5f) continue;
        dl->AddLine(ImVec2(px, f.p1.y), ImVec2(px, f.p1.y + 4), kTickColour);
        const ImVec2 ts = ImGui::CalcTextSize(t.labels[i].c_str());
        const float x0 = std::clamp(px - ts.x * 0.5f, f.outer0.x, f.outer1.x - ts.x);
        if (x0 < last_right + 6) continue;  // would touch the previous label
        dl->AddText(ImVec2(x0, f.p1.y + 4), kAxisText, t.labels[i].c_str());
        last_right = x0 + ts.x;
    }
    if (spec.title) {
        const ImVec2 ts = ImGui::CalcTextSize(spec.title);
        const float x0 = std::max(f.outer0.x, f.p0.x + (f.width() - ts.x) * 0.5f);
        dl->AddText(ImVec2(x0, f.p1.y + 6 + ImGui::GetTextLineHeight()), kAxisTitle, spec.title);
    }
}

void draw_y_axis(ImDrawList* dl, const PlotFrame& f, const AxisRange& y, const AxisSpec& spec, bool y_down) {
    const AxisTicks t = axis_ticks(spec.unit, y.lo, y.hi, y_tick_target(f.height()));
    const float line = ImGui::GetTextLineHeight();
    float last = -1e30f;  // screen y of the previous label's far edge, in drawing order
    for (size_t i = 0; i < t.values.size(); ++i) {
        const size_t k = y_down ? i : t.values.size() - 1 - i;  // top to bottom
        const float py = float(y_down ? axis_to_pixel(y, t.values[k], f.p0.y, f.p1.y) : axis_to_pixel(y, t.values[k], f.p1.y, f.p0.y));
        if (py < f.p0.y - 0.5f || py > f.p1.y + 0.5f) continue;
        dl->AddLine(ImVec2(f.p0.x - 4, py), ImVec2(f.p0.x, py), kTickColour);
        const ImVec2 ts = ImGui::CalcTextSize(t.labels[k].c_str());
        // Centred on the tick, kept inside the data's height (the top row holds the title).
        const float y0 = std::clamp(py - line * 0.5f, f.p0.y, std::max(f.p0.y, f.p1.y - line));
        if (y0 < last + 2) continue;
        dl->AddText(ImVec2(f.p0.x - 8 - ts.x, y0), kAxisText, t.labels[k].c_str());
        last = y0 + line;
    }
    if (spec.title) dl->AddText(ImVec2(f.outer0.x, f.outer0.y), kAxisTitle, spec.title);
}

float colour_bar_width(double lo, double hi, AxisUnit unit, const char* title) {
    float widest = 0;
    for (const auto& l : axis_ticks(unit, lo, hi, 4).labels) widest = std::max(widest, ImGui::CalcTextSize(l.c_str()).x);
    for (double v : {lo, hi}) widest = std::max(widest, ImGui::CalcTextSize(axis_value_text(unit, v).c_str()).x);
    (void)title;  // the title sits in the plot's top row, right-aligned (see draw_colour_bar)
    return 12 + 6 + widest + 10;
}

void draw_colour_bar(ImDrawList* dl, ImVec2 p0, ImVec2 p1, double lo, double hi, AxisUnit unit, const char* title, bool log,
                     float t_lo, float t_hi) {
    const float bx0 = p0.x + 8, bx1 = bx0 + 12;
    const float h = p1.y - p0.y;
    if (h < 8) return;
    // 64 bands, bottom (t_lo) to top (t_hi).
    constexpr int kBands = 64;
    for (int i = 0; i < kBands; ++i) {
        const float a = p1.y - h * float(i) / kBands, b = p1.y - h * float(i + 1) / kBands;
        const float t = t_lo + (t_hi - t_lo) * (float(i) + 0.5f) / kBands;
        dl->AddRectFilled(ImVec2(bx0, b), ImVec2(bx1, a + 0.5f), colormap(t));
    }
    dl->AddRect(ImVec2(bx0 - 1, p0.y - 1), ImVec2(bx1 + 1, p1.y + 1), IM_COL32(200, 200, 200, 120));
    if (title) {  // right-aligned in the row above: a long title reaches left, over the plot's top margin
        const ImVec2 ts = ImGui::CalcTextSize(title);
        dl->AddText(ImVec2(p1.x - ts.x, p0.y - ImGui::GetTextLineHeight() - 2), kAxisTitle, title);
    }
    if (!(hi > lo)) {
        // One value: a single label in the middle.
        dl->AddText(ImVec2(bx1 + 6, p0.y + h * 0.5f - ImGui::GetTextLineHeight() * 0.5f), kAxisText,
                    axis_value_text(unit, lo).c_str());
        return;
    }
    const float line = ImGui::GetTextLineHeight();
    auto to_t = [&](double v) {
        if (log && lo > 0) return (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo));
        return (v - lo) / (hi - lo);
    };
    std::vector<double> values;
    std::vector<std::string> labels;
    if (log && lo > 0) {
        // Decades and their 2x / 5x between lo and hi; the ends always.
        for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
            for (double m : {1.0, 2.0, 5.0})
                if (d * m >= lo && d * m <= hi) values.push_back(d * m);
        if (values.size() > size_t(std::max(2.f, h / (1.6f * line)))) {
            std::vector<double> decades;
            for (double v : values)
                if (std::fabs(std::log10(v) - std::round(std::log10(v))) < 1e-9) decades.push_back(v);
            values = decades;
        }
        for (double v : values) labels.push_back(axis_value_text(unit, v));
    } else {
        const AxisTicks t = axis_ticks(unit, lo, hi, std::clamp(int(h / (4.f * line)), 2, 6));
        values = t.values, labels = t.labels;
    }
    float last = 1e30f;
    for (size_t i = 0; i < values.size(); ++i) {
        const float py = p1.y - h * float(std::clamp(to_t(values[i]), 0.0, 1.0));
        dl->AddLine(ImVec2(bx1, py), ImVec2(bx1 + 3, py), kTickColour);
        const float y0 = std::clamp(py - line * 0.5f, p0.y, std::max(p0.y, p1.y - line));  // inside the bar's height
        if (y0 + line > last - 1) continue;  // bottom to top: skip labels touching the previous
        dl->AddText(ImVec2(bx1 + 6, y0), kAxisText, labels[i].c_str());
        last = y0;
    }
}

float legend_height(float width, const std::vector<LegendEntry>& entries) {
    const float line = ImGui::GetTextLineHeight() + 2;
    float x = 0, h = entries.empty() ? 0 : line;
    for (const auto& e : entries) {
        const float w = 16 + ImGui::CalcTextSize(e.text.c_str()).x + 14;
        if (x > 0 && x + w > width) x = 0, h += line;
        x += w;
    }
    return h;
}

float draw_legend(ImDrawList* dl, ImVec2 at, float max_x, const std::vector<LegendEntry>& entries) {
    const float line = ImGui::GetTextLineHeight() + 2;
    float x = at.x, y = at.y;
    for (const auto& e : entries) {
        const float w = 16 + ImGui::CalcTextSize(e.text.c_str()).x + 14;
        if (x > at.x && x + w > max_x) x = at.x, y += line;
        const float sy = y + (line - 10) * 0.5f - 1;
        dl->AddRectFilled(ImVec2(x, sy), ImVec2(x + 10, sy + 10), e.colour);
        dl->AddRect(ImVec2(x - 1, sy - 1), ImVec2(x + 11, sy + 11), IM_COL32(200, 200, 200, 120));  // dark swatches stay visible
        dl->AddText(ImVec2(x + 16, y), kAxisText, e.text.c_str());
        x += w;
    }
    return entries.empty() ? 0 : y + line - at.y;
}

bool plot_zoom_pan(const PlotFrame& f, AxisRange& x, double x_min, double x_max, AxisRange* y, double y_min,
                   double y_max, bool y_down) {
    const ImGuiIO& io = ImGui::GetIO();
    bool changed = false;
    if (f.hovered && io.MouseWheel != 0) {
        const double factor = std::pow(0.85, double(io.MouseWheel));
        const bool only_y = y && io.KeyShift;
        if (!only_y) {
            x.zoom(pixel_to_axis(x, f.mouse.x, f.p0.x, f.p1.x), factor, (x_max - x_min) * 1e-6);
            x.clamp_to(x_min, x_max);
        }
        if (y && (only_y || io.KeyCtrl)) {
            const double a = y_down ? pixel_to_axis(*y, f.mouse.y, f.p0.y, f.p1.y)
                                    : pixel_to_axis(*y, f.mouse.y, f.p1.y, f.p0.y);
            y->zoom(a, factor, (y_max - y_min) * 1e-6);
            y->clamp_to(y_min, y_max);
        }
        changed = true;
    }
    if (f.active && ImGui::IsMouseDragging(ImGuiMouseButton_Left, 0.0f)) {
        const ImVec2 d = io.MouseDelta;
        if (d.x != 0 && f.width() > 0) {
            x.pan(-double(d.x) / f.width() * x.span());
            x.clamp_to(x_min, x_max);
            changed = true;
        }
        if (y && d.y != 0 && f.height() > 0) {
            y->pan((y_down ? -1.0 : 1.0) * double(d.y) / f.height() * y->span());
            y->clamp_to(y_min, y_max);
            changed = true;
        }
    }
    return changed;
}

void draw_x_ticks(ImDrawList* dl, const PlotFrame& f, const AxisRange& x, std::string (*label)(double)) {
    const int target = std::max(2, int(f.width() / 110));
    for (double v : nice_ticks(x.lo, x.hi, target)) {
        const float px = float(axis_to_pixel(x, v, f.p0.x, f.p1.x));
        dl->AddLine(ImVec2(px, f.p1.y - 4), ImVec2(px, f.p1.y), IM_COL32(200, 200, 200, 160));
        const std::string s = label(v);
        const ImVec2 at(px + 3, f.p1.y - ImGui::GetFontSize() - 4), ts = ImGui::CalcTextSize(s.c_str());
        dl->AddRectFilled(ImVec2(at.x - 1, at.y), ImVec2(at.x + ts.x + 1, at.y + ts.y), IM_COL32(0, 0, 0, 110));
        dl->AddText(at, IM_COL32(220, 220, 220, 230), s.c_str());
    }
}

void draw_y_ticks(ImDrawList* dl, const PlotFrame& f, const AxisRange& y, std::string (*label)(double), bool y_down) {
    const int target = std::max(2, int(f.height() / 50));
    for (double v : nice_ticks(y.lo, y.hi, target)) {
        const float py = float(y_down ? axis_to_pixel(y, v, f.p0.y, f.p1.y) : axis_to_pixel(y, v, f.p1.y, f.p0.y));
        // Tick at the edge, label just above it (a label beside the tick would read as a minus sign).
        dl->AddLine(ImVec2(f.p0.x, py), ImVec2(f.p0.x + 6, py), IM_COL32(200, 200, 200, 160));
        const std::string s = label(v);
        const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
        const ImVec2 at(f.p0.x + 2, std::max(f.p0.y, py - ts.y - 1));
        dl->AddRectFilled(ImVec2(at.x - 1, at.y), ImVec2(at.x + ts.x + 1, at.y + ts.y), IM_COL32(0, 0, 0, 110));
        dl->AddText(at, IM_COL32(220, 220, 220, 230), s.c_str());
    }
}

void draw_empty_state(const char* text) {
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const ImVec2 ts = ImGui::CalcTextSize(text);
    const ImVec2 c = ImGui::GetCursorPos();
    ImGui::SetCursorPos(ImVec2(c.x + std::max(0.f, (avail.x - ts.x) * 0.5f), c.y + std::max(0.f, (avail.y - ts.y) * 0.4f)));
    ImGui::TextDisabled("%s", text);
}

}  // namespace kv::views
