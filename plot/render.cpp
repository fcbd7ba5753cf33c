// Cairo rendering of a Figure (see render.h).
#include "render.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "figure_file.h"
#include "palette.h"
#include "scale.h"
#include "ticks.h"

namespace kv::plot {

namespace {

constexpr double kLeft = 70, kBottom = 50, kGap = 28, kLegend = 170, kFont = 11, kMargin = 8, kNoteLine = 15;

// Width of `s` in the figure's font at `size` points, measured before the canvas exists (the
// canvas's width depends on it: the legend's longest label, the title).
double text_width(const std::string& s, double size) {
    cairo_surface_t* surface = cairo_image_surface_create(CAIRO_FORMAT_A8, 1, 1);
    cairo_t* cr = cairo_create(surface);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, size);
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.c_str(), &e);
    cairo_destroy(cr);
    cairo_surface_destroy(surface);
    return e.x_advance;
}

// Room above the panels: their titles, plus the figure's title when it has one.
double top_margin(const Figure& f) { return f.title.empty() ? 34 : 54; }

struct Range {
    double lo = HUGE_VAL, hi = -HUGE_VAL;
    void add(double v) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    bool empty() const { return lo > hi; }
};

void set_rgb(cairo_t* cr, Rgb c) { cairo_set_source_rgb(cr, c.r, c.g, c.b); }

// One marker as a closed sub-path centred on (x, y), about the same area for every shape.
void marker_path(cairo_t* cr, Marker m, double x, double y) {
    constexpr double r = 2.8;
    cairo_new_sub_path(cr);
    switch (m) {
        case Marker::CIRCLE: cairo_arc(cr, x, y, r, 0, 2 * M_PI); break;
        case Marker::SQUARE: cairo_rectangle(cr, x - r * 0.9, y - r * 0.9, r * 1.8, r * 1.8); break;
        case Marker::DIAMOND:
            cairo_move_to(cr, x, y - r * 1.25);
            cairo_line_to(cr, x + r * 1.25, y);
            cairo_line_to(cr, x, y + r * 1.25);
            cairo_line_to(cr, x - r * 1.25, y);
            break;
        case Marker::TRIANGLE_UP:
        case Marker::TRIANGLE_DOWN: {
            const double d = m == Marker::TRIANGLE_UP ? 1 : -1, h = r * 1.4;
            cairo_move_to(cr, x, y - d * h);
            cairo_line_to(cr, x + h, y + d * h * 0.75);
            cairo_line_to(cr, x - h, y + d * h * 0.75);
            break;
        }
    }
    cairo_close_path(cr);
}

// A series' line style: colour, width and dash (the caller strokes, then resets the dash).
void set_line_style(cairo_t* cr, const SeriesStyle& st) {
    set_rgb(cr, st.color);
    cairo_set_line_width(cr, 1.8);
    cairo_set_dash(cr, st.dash.data(), int(st.dash.size()), 0);
}

void draw(cairo_t* cr, const Figure& fig, double width, double height, const Scale& xs0, const Ticks& xt, const Ticks& yt,
          double ylo, double yhi, const std::vector<std::string>& labels) {
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr, kFont);
    const double pw = fig.panel_width, ph = fig.panel_height, kTop = top_margin(fig);
    if (!fig.title.empty()) {
        // Centred over the panels, slid sideways as far as it must to stay on the canvas (the
        // canvas is made at least as wide as the title).
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_set_font_size(cr, kFont + 2);
        cairo_text_extents_t e;
        cairo_text_extents(cr, fig.title.c_str(), &e);
        const double plots_w = double(fig.panels.size()) * pw + double(fig.panels.size() - 1) * kGap;
        const double left = std::clamp(kLeft + plots_w / 2 - e.width / 2, kMargin, std::max(kMargin, width - kMargin - e.width));
        text_at(cr, fig.title, left, 6, 0, 0);
        cairo_set_font_size(cr, kFont);
    }
    for (size_t p = 0; p < fig.panels.size(); ++p) {
        const Panel& panel = fig.panels[p];
        const double x0 = kLeft + double(p) * (pw + kGap), y0 = kTop;
        Scale xs = xs0;
        xs.px0 = x0;
        xs.px1 = x0 + pw;
        const Scale ys{ylo, yhi, y0 + ph, y0, false};
        // grid
        cairo_set_line_width(cr, 0.5);
        cairo_set_source_rgb(cr, 0.85, 0.85, 0.85);
        for (double v : xt.values) {
            cairo_move_to(cr, xs(v), y0);
            cairo_line_to(cr, xs(v), y0 + ph);
        }
        for (double v : yt.values) {
            cairo_move_to(cr, x0, ys(v));
            cairo_line_to(cr, x0 + pw, ys(v));
        }
        cairo_stroke(cr);
        // frame and tick labels
        cairo_set_source_rgb(cr, 0, 0, 0);
        cairo_set_line_width(cr, 1);
        cairo_rectangle(cr, x0, y0, pw, ph);
        cairo_stroke(cr);
        // x labels left to right; one that would touch the last drawn label is left out (its
        // grid line stays), so close data values never print over each other.
        double last_right = -HUGE_VAL;
        for (double v : xt.values) {
            const std::string s = tick_label(v);
            cairo_text_extents_t e;
            cairo_text_extents(cr, s.c_str(), &e);
            const double left = xs(v) - e.width / 2;
            if (left < last_right + 4) continue;
            text_at(cr, s, xs(v), y0 + ph + 5, 0.5, 0);
            last_right = left + e.width;
        }
        if (p == 0)
            for (double v : yt.values) text_at(cr, tick_label(v), x0 - 5, ys(v), 1, 0.5);
        if (!panel.title.empty()) text_at(cr, panel.title, x0 + pw / 2, y0 - 5, 0.5, 1);
        // reference lines, dashed, in the legend's order after the series
        const double dash[] = {6, 3};
        for (const auto& r : panel.references) {
            cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
            cairo_set_line_width(cr, 1.2);
            cairo_set_dash(cr, dash, 2, 0);
            cairo_move_to(cr, x0, ys(r.y));
            cairo_line_to(cr, x0 + pw, ys(r.y));
            cairo_stroke(cr);
            cairo_set_dash(cr, nullptr, 0, 0);
            // several references share one style: each says which it is
            if (panel.references.size() > 1) text_at(cr, r.label, x0 + 4, ys(r.y) - 2, 0, 1);
        }
        // series: one polyline each, then its markers (style by legend position, so a label
        // looks the same in every panel)
        for (const auto& s : panel.series) {
            const SeriesStyle style = series_style(size_t(std::find(labels.begin(), labels.end(), s.label) - labels.begin()));
            std::vector<size_t> order(s.x.size());
            for (size_t i = 0; i < order.size(); ++i) order[i] = i;
            std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return s.x[a] < s.x[b]; });
            set_line_style(cr, style);
            for (size_t k = 0; k < order.size(); ++k) {
                const double px = xs(s.x[order[k]]), py = ys(s.y[order[k]]);
                if (k == 0) cairo_move_to(cr, px, py);
                else cairo_line_to(cr, px, py);
            }
            cairo_stroke(cr);
            cairo_set_dash(cr, nullptr, 0, 0);
            for (size_t i : order) marker_path(cr, style.marker, xs(s.x[i]), ys(s.y[i]));
            cairo_fill(cr);
            // standard-error bars with caps, in the series' colour, solid
            set_line_style(cr, style);
            cairo_set_dash(cr, nullptr, 0, 0);
            cairo_set_line_width(cr, 1.0);
            for (size_t i = 0; i < s.se.size(); ++i) {
                if (!(s.se[i] > 0)) continue;
                const double px = xs(s.x[i]), lo = ys(s.y[i] - s.se[i]), hi = ys(s.y[i] + s.se[i]);
                cairo_move_to(cr, px, lo), cairo_line_to(cr, px, hi);
                cairo_move_to(cr, px - 3, lo), cairo_line_to(cr, px + 3, lo);
                cairo_move_to(cr, px - 3, hi), cairo_line_to(cr, px + 3, hi);
            }
            cairo_stroke(cr);
        }
    }
    // axis titles
    cairo_set_source_rgb(cr, 0, 0, 0);
    const double plots_w = double(fig.panels.size()) * pw + double(fig.panels.size() - 1) * kGap;
    const double notes_h = kNoteLine * double(fig.notes.size());
    text_at(cr, fig.x_title, kLeft + plots_w / 2, height - 8 - notes_h, 0.5, 1);
    for (size_t i = 0; i < fig.notes.size(); ++i) text_at(cr, fig.notes[i], kMargin, height - 8 - kNoteLine * double(fig.notes.size() - 1 - i), 0, 1);
    cairo_save(cr);
    cairo_translate(cr, 14, kTop + ph / 2);
    cairo_rotate(cr, -M_PI / 2);
    text_at(cr, fig.y_title, 0, 0, 0.5, 0.5);
    cairo_restore(cr);
    // legend: series styles (line, dash and marker), then the reference lines
    double ly = kTop + 8;
    const double lx = kLeft + plots_w + 16;
    for (size_t i = 0; i < labels.size(); ++i, ly += 17) {
        const SeriesStyle style = series_style(i);
        set_line_style(cr, style);
        cairo_move_to(cr, lx, ly);
        cairo_line_to(cr, lx + 22, ly);
        cairo_stroke(cr);
        cairo_set_dash(cr, nullptr, 0, 0);
        marker_path(cr, style.marker, lx + 11, ly);
        cairo_fill(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, labels[i], lx + 28, ly, 0, 0.5);
    }
    std::vector<std::string> refs;
    for (const auto& p : fig.panels)
        for (const auto& r : p.references)
            if (std::find(refs.begin(), refs.end(), r.label) == refs.end()) refs.push_back(r.label);
    const double dash[] = {6, 3};
    for (const auto& r : refs) {
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        cairo_set_line_width(cr, 1.2);
        cairo_set_dash(cr, dash, 2, 0);
        cairo_move_to(cr, lx, ly);
        cairo_line_to(cr, lx + 22, ly);
        cairo_stroke(cr);
        cairo_set_dash(cr, nullptr, 0, 0);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text_at(cr, r, lx + 28, ly, 0, 0.5);
        ly += 17;
    }
}

}  // namespace

void render_figure(const Figure& fig, const std::string& path) {
    const std::string fmt = figure_format(path);
    if (fmt.empty()) throw std::invalid_argument("figure '" + path + "': unknown file type; expected a name ending in .svg, .png or .pdf");
    if (fig.panels.empty()) throw std::invalid_argument("figure '" + path + "': nothing to draw (no panels)");
    Range xr, yr;
    std::vector<double> xdata;
    std::vector<std::string> labels;  // legend order = first appearance
    for (const auto& p : fig.panels) {
        for (const auto& s : p.series) {
            if (s.x.size() != s.y.size()) throw std::invalid_argument("series '" + s.label + "': x and y differ in length");
            if (!s.se.empty() && s.se.size() != s.y.size())
                throw std::invalid_argument("series '" + s.label + "': se has " + std::to_string(s.se.size()) + " values for " +
                                            std::to_string(s.y.size()) + " points; expected none or one per point");
            for (size_t i = 0; i < s.x.size(); ++i) {
                const double se = s.se.empty() ? 0.0 : s.se[i];
                if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i]) || (fig.log2_x && s.x[i] <= 0) || !(se >= 0) || !std::isfinite(se))
                    throw std::invalid_argument("series '" + s.label + "': point " + std::to_string(i) +
                                                " is not finite (or x <= 0 on a log2 axis, or a negative standard error)");
                xr.add(s.x[i]);
                yr.add(s.y[i] - se);
                yr.add(s.y[i] + se);
                xdata.push_back(s.x[i]);
            }
            if (std::find(labels.begin(), labels.end(), s.label) == labels.end()) labels.push_back(s.label);
        }
        for (const auto& r : p.references) yr.add(r.y);
    }
    if (xr.empty()) throw std::invalid_argument("figure '" + path + "': nothing to draw (no points)");
    Scale xs;
    Ticks xt;
    xs.log2 = fig.log2_x;
    if (fig.log2_x) {
        xs.lo = xr.lo / std::sqrt(std::sqrt(2.0));  // a quarter octave of air on each side
        xs.hi = xr.hi * std::sqrt(std::sqrt(2.0));
        xt = log2_data_ticks(xdata, xs.lo, xs.hi);
    } else {
        xt = fig.integer_x ? integer_ticks(xr.lo, xr.hi) : linear_ticks(xr.lo, xr.hi);
        xs.lo = xt.lo;
        xs.hi = xt.hi;
    }
    const Ticks yt = linear_ticks(yr.lo, yr.hi);
    // Air between the data and the frame: a line at the data's extreme (dense at 1.0 on a kept
    // mass axis whose top tick is 1) would otherwise lie on the frame's edge and vanish.
    const double ypad = 0.04 * (yt.hi - yt.lo), ylo = std::min(yt.lo, yr.lo - ypad), yhi = std::max(yt.hi, yr.hi + ypad);
    size_t refs = 0;
    double label_w = 0;  // the legend's longest entry (series and reference lines)
    for (const auto& l : labels) label_w = std::max(label_w, text_width(l, kFont));
    for (const auto& p : fig.panels) {
        refs += p.references.size();
        for (const auto& r : p.references) label_w = std::max(label_w, text_width(r.label, kFont));
    }
    // The legend sits 16 points right of the panels, its text 28 points into it.
    const double legend_w = std::max(kLegend, 16 + 28 + label_w + kMargin);
    double width = std::max(kLeft + double(fig.panels.size()) * fig.panel_width + double(fig.panels.size() - 1) * kGap + legend_w,
                            fig.title.empty() ? 0.0 : text_width(fig.title, kFont + 2) + 2 * kMargin);
    for (const std::string& n : fig.notes) width = std::max(width, text_width(n, kFont) + 2 * kMargin);
    // Tall enough for the legend too (17 points an entry), however many series there are.
    const double notes_h = kNoteLine * double(fig.notes.size());
    const double height = std::max(top_margin(fig) + fig.panel_height + kBottom, top_margin(fig) + 8 + 17 * double(labels.size() + refs) + 8) + notes_h;

    write_figure_file(path, width, height,
                      [&](cairo_t* cr) { draw(cr, fig, width, height, xs, xt, yt, ylo, yhi, labels); });
}

}  // namespace kv::plot
