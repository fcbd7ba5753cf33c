// Small helpers shared by the plotted views: a zoomable/pannable 1-D range, axis ticks at
// "nice" numbers, value <-> pixel mapping and short text for bytes, times and counts. The pure
// parts are plain functions (tested without ImGui); the ImGui parts draw an axis frame and turn
// mouse wheel/drag over an item into range changes. Holds no state of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <imgui.h>

namespace kv::views {

// A visible interval [lo, hi) of a data axis, kept inside [min, max] when those bound it.
struct AxisRange {
    double lo = 0, hi = 1;
    double span() const { return hi - lo; }
    // Zoom by `factor` (< 1 zooms in) keeping the data value `anchor` at the same pixel.
    void zoom(double anchor, double factor, double min_span = 1e-9);
    // Shift by `delta` data units.
    void pan(double delta) { lo += delta, hi += delta; }
    // Keep inside [min, max] (shifting first, shrinking only if wider than the bounds).
    void clamp_to(double min, double max);
    bool operator==(const AxisRange& o) const { return lo == o.lo && hi == o.hi; }
};

// Data value <-> pixel along an axis drawn from p0 to p1 (p1 < p0 for y axes growing upwards).
inline double axis_to_pixel(const AxisRange& r, double v, double p0, double p1) {
    return p0 + (v - r.lo) / (r.hi - r.lo) * (p1 - p0);
}
inline double pixel_to_axis(const AxisRange& r, double px, double p0, double p1) {
    return r.lo + (px - p0) / (p1 - p0) * (r.hi - r.lo);
}

// Tick positions at 1, 2 or 5 x 10^k covering [lo, hi], about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

std::string format_bytes(double bytes);     // "1.50 GiB", "-12.0 KiB", "512 B"
std::string format_duration_ns(double ns);  // "1.25 s", "3.4 ms", "870 us", "12 ns"
std::string format_count(double v);         // "1.2M", "34.5k", "12", "0.0123"

// [SECTION] ImGui helpers ------------------------------------------------------------------
// Reserves an interactive rectangle (InvisibleButton `id`) of `size` at the cursor and returns
// its screen rectangle; `hovered`/`active` report the item state.
struct PlotFrame {
    ImVec2 p0, p1;  // screen rectangle
    bool hovered = false, active = false;
    ImVec2 mouse;  // mouse position (screen)
    float width() const { return p1.x - p0.x; }
    float height() const { return p1.y - p0.y; }
};
PlotFrame begin_plot_frame(const char* id, ImVec2 size);
// Mouse interaction over a plot frame: wheel zooms x (Shift: y too when `y` is given) around the
// cursor, left drag pans. Returns true when a range changed. `x_bounds`/`y_bounds` clamp.
bool plot_zoom_pan(const PlotFrame& f, AxisRange& x, double x_min, double x_max, AxisRange* y = nullptr,
                   double y_min = 0, double y_max = 0, bool y_down = true);
// Draws ticks and labels along the bottom (x) and left (y, if given) edges inside the frame.
void draw_x_ticks(ImDrawList* dl, const PlotFrame& f, const AxisRange& x, std::string (*label)(double));
void draw_y_ticks(ImDrawList* dl, const PlotFrame& f, const AxisRange& y, std::string (*label)(double), bool y_down);

// An explicit empty state ("no evictions recorded yet") centred in the remaining region.
void draw_empty_state(const char* text);

inline ImTextureID texture_id(uint64_t id) { return reinterpret_cast<ImTextureID>(static_cast<uintptr_t>(id)); }

}  // namespace kv::views
