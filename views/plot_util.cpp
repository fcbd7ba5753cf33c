// Plot helpers (see plot_util.h).
#include "views/plot_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
