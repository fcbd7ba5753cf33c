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

// What an axis counts. Ticks fall on round numbers *of the unit the axis prints*: bytes step by
// 1/2/5 x 10^k KiB, MiB or GiB (never 190.73 MiB), times by 1/2/5 x 10^k ns, us, ms or s.
// INTEGER: indices (steps, samples, chunks), ticked at whole numbers only.
enum class AxisUnit : uint8_t { NUMBER = 0, INTEGER, BYTES, NANOSECONDS, SECONDS, COUNT };
struct AxisTicks {
    std::vector<double> values;       // in data units (bytes, ns, ...)
    std::vector<std::string> labels;  // one per value, all in one display unit ("200 MiB")
    double step = 0;                  // in data units
    double unit = 1;                  // data units per display unit (1 MiB = 1048576 bytes)
};
AxisTicks axis_ticks(AxisUnit unit, double lo, double hi, int target = 6);
// One value in the unit that suits it, 3-4 significant digits ("5 ms", "1.5 GiB", "0.0123").
std::string axis_value_text(AxisUnit unit, double v);

std::string format_bytes(double bytes);     // "1.50 GiB", "-12.0 KiB", "512 B"
std::string format_duration_ns(double ns);  // "1.25 s", "3.4 ms", "870 us", "12 ns"
std::string format_count(double v);         // "1.2M", "34.5k", "12", "0.0123"

// [SECTION] ImGui helpers ------------------------------------------------------------------
// Reserves an interactive rectangle (InvisibleButton `id`) of `size` at the cursor and returns
// its screen rectangle; `hovered`/`active` report the item state.
struct PlotFrame {
    ImVec2 p0, p1;  // screen rectangle of the data (what ranges map onto)
    ImVec2 outer0, outer1;  // with the margins that hold tick labels, axis titles, colour bar
    bool hovered = false, active = false;
    ImVec2 mouse;  // mouse position (screen)
    float width() const { return p1.x - p0.x; }
    float height() const { return p1.y - p0.y; }
};
PlotFrame begin_plot_frame(const char* id, ImVec2 size);

// An axis as drawn: its unit and title ("token position", "time since run start").
struct AxisSpec {
    AxisUnit unit = AxisUnit::NUMBER;
    const char* title = nullptr;
};
// Room around the data rectangle: left for the y tick labels, top for the y title (one text
// line), bottom for the x tick labels and title, right for a colour bar or legend.
struct PlotMargins {
    float left = 0, top = 0, right = 0, bottom = 0;
};
// Margins a plot of `outer_height` needs for these axes (x or y may be null: no axis there).
// The y labels' width is measured on the ticks of `y_range`.
PlotMargins plot_margins(const AxisSpec* x, const AxisSpec* y, const AxisRange* y_range, float outer_height,
                         float right = 8);
// Like begin_plot_frame, but `size` is the outer size and the interactive data rectangle sits
// inside the margins (the whole outer rectangle is laid out as one item).
PlotFrame begin_plot_frame(const char* id, ImVec2 size, const PlotMargins& m);
// Tick count that keeps labels apart on an axis this long.
int x_tick_target(float width_px);
int y_tick_target(float height_px);
// Ticks, labels and title in the margins, outside the data: nothing covers the data, and the
// x and y labels can never overlap each other. Labels that would collide are skipped.
void draw_x_axis(ImDrawList* dl, const PlotFrame& f, const AxisRange& x, const AxisSpec& spec);
void draw_y_axis(ImDrawList* dl, const PlotFrame& f, const AxisRange& y, const AxisSpec& spec, bool y_down);
// A vertical colour bar of the shared colour map, t in [t_lo, t_hi] drawn bottom to top, for
// data values [lo, hi] (log: the colours are log-spaced), ticks right of it; `title` above it.
// Drawn in [p0, p1) (the bar takes 12 px, the labels the rest). Width it needs: colour_bar_width().
void draw_colour_bar(ImDrawList* dl, ImVec2 p0, ImVec2 p1, double lo, double hi, AxisUnit unit, const char* title,
                     bool log = false, float t_lo = 0, float t_hi = 1);
float colour_bar_width(double lo, double hi, AxisUnit unit, const char* title);
// A legend as a row of swatches and names starting at `at`, wrapping at `max_x`; returns its
// height. Drawn outside data (the caller reserves the row).
struct LegendEntry {
    uint32_t colour = 0;
    std::string text;
};
float draw_legend(ImDrawList* dl, ImVec2 at, float max_x, const std::vector<LegendEntry>& entries);
float legend_height(float width, const std::vector<LegendEntry>& entries);
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
