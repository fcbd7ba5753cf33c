// Cairo rendering of a Heatmap (see heatmap.h).
#include "heatmap.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "figure_file.h"

namespace kv::plot {

namespace {

constexpr double kLeft = 70, kTop = 54, kBottom = 50, kGap = 24, kBar = 70, kFont = 11, kCell = 34;

}  // namespace

void heatmap_colour(double v, double lo, double hi, double rgb[3]) {
    // Red - yellow - green (as KVCache-Factory's needle maps): low = lost.
    static const double stops[3][3] = {{0.84, 0.19, 0.15}, {0.99, 0.88, 0.55}, {0.10, 0.60, 0.31}};
    const double u = hi > lo ? std::clamp((v - lo) / (hi - lo), 0.0, 1.0) : 1.0;
    const int k = u < 0.5 ? 0 : 1;
    const double f = u < 0.5 ? u * 2 : (u - 0.5) * 2;
    for (int c = 0; c < 3; ++c) rgb[c] = stops[k][c] + f * (stops[k + 1][c] - stops[k][c]);
}

void render_heatmap(const Heatmap& h, const std::string& path) {
    const std::string fmt = figure_format(path);
    if (fmt.empty()) throw std::invalid_argument("figure '" + path + "': unknown file type; expected a name ending in .svg, .png or .pdf");
    if (h.panels.empty() || h.x_labels.empty() || h.y_labels.empty())
        throw std::invalid_argument("heat map '" + path + "': nothing to draw (no panel, column or row)");
    for (const auto& p : h.panels) {
        if (p.values.size() != h.y_labels.size())
            throw std::invalid_argument("heat map panel '" + p.title + "': " + std::to_string(p.values.size()) + " rows; expected " +
                                        std::to_string(h.y_labels.size()));
        for (const auto& row : p.values)
            if (row.size() != h.x_labels.size())
                throw std::invalid_argument("heat map panel '" + p.title + "': a row of " + std::to_string(row.size()) + " cells; expected " +
                                            std::to_string(h.x_labels.size()));
    }
    const double cols = double(h.x_labels.size()), rows = double(h.y_labels.size()), np = double(h.panels.size());
    const double cw = std::max(kCell, 300.0 / cols), ch = std::max(18.0, 220.0 / rows);
    const double pw = cw * cols, ph = ch * rows;
    const double width = kLeft + np * pw + (np - 1) * kGap + kBar + 16, height = kTop + ph + kBottom;
    write_figure_file(path, width, height, [&](cairo_t* cr) {
        cairo_set_source_rgb(cr, 1, 1, 1);
        cairo_paint(cr);
        cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
        cairo_set_font_size(cr, kFont);
        cairo_set_source_rgb(cr, 0, 0, 0);
        if (!h.title.empty()) {
            cairo_set_font_size(cr, kFont + 2);
            text_at(cr, h.title, width / 2, 8, 0.5, 0);
            cairo_set_font_size(cr, kFont);
        }
        for (size_t k = 0; k < h.panels.size(); ++k) {
            const HeatmapPanel& p = h.panels[k];
            const double x0 = kLeft + double(k) * (pw + kGap), y0 = kTop;
            cairo_set_source_rgb(cr, 0, 0, 0);
            text_at(cr, p.title, x0 + pw / 2, y0 - 6, 0.5, 1);
            for (size_t r = 0; r < p.values.size(); ++r)
                for (size_t c = 0; c < p.values[r].size(); ++c) {
                    const double v = p.values[r][c], x = x0 + double(c) * cw, y = y0 + double(r) * ch;
                    double rgb[3] = {0.85, 0.85, 0.85};
                    if (std::isfinite(v)) heatmap_colour(v, h.lo, h.hi, rgb);
                    cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
                    cairo_rectangle(cr, x, y, cw, ch);
                    cairo_fill(cr);
                    if (std::isfinite(v) && cw >= 26 && ch >= 14) {
                        char t[16];
                        std::snprintf(t, sizeof t, "%.2g", v);
                        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
                        cairo_set_font_size(cr, kFont - 2);
                        text_at(cr, t, x + cw / 2, y + ch / 2, 0.5, 0.5);
                        cairo_set_font_size(cr, kFont);
                    }
                }
            cairo_set_source_rgb(cr, 0, 0, 0);
            cairo_set_line_width(cr, 0.8);
            cairo_rectangle(cr, x0, y0, pw, ph);
            cairo_stroke(cr);
            for (size_t c = 0; c < h.x_labels.size(); ++c) text_at(cr, h.x_labels[c], x0 + (double(c) + 0.5) * cw, y0 + ph + 5, 0.5, 0);
            if (k == 0)
                for (size_t r = 0; r < h.y_labels.size(); ++r) text_at(cr, h.y_labels[r], x0 - 5, y0 + (double(r) + 0.5) * ch, 1, 0.5);
            text_at(cr, h.x_title, x0 + pw / 2, y0 + ph + 24, 0.5, 0);
        }
        // The y title, turned, left of the first panel.
        cairo_save(cr);
        cairo_translate(cr, 14, kTop + ph / 2);
        cairo_rotate(cr, -M_PI / 2);
        text_at(cr, h.y_title, 0, 0, 0.5, 0.5);
        cairo_restore(cr);
        // The colour bar: hi at the top.
        const double bx = kLeft + np * pw + (np - 1) * kGap + 16, bw = 14;
        for (int i = 0; i < 64; ++i) {
            double rgb[3];
            heatmap_colour(h.hi - (h.hi - h.lo) * (double(i) + 0.5) / 64.0, h.lo, h.hi, rgb);
            cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
            cairo_rectangle(cr, bx, kTop + ph * double(i) / 64.0, bw, ph / 64.0 + 0.5);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0, 0, 0);
        char lo[32], hi[32];
        std::snprintf(lo, sizeof lo, "%g", h.lo);
        std::snprintf(hi, sizeof hi, "%g", h.hi);
        text_at(cr, hi, bx + bw + 4, kTop, 0, 0);
        text_at(cr, lo, bx + bw + 4, kTop + ph, 0, 1);
        // Its title turned along the bar's right side (a long title would not fit below it).
        cairo_save(cr);
        cairo_translate(cr, bx + bw + 34, kTop + ph / 2);
        cairo_rotate(cr, -M_PI / 2);
        text_at(cr, h.value_title, 0, 0, 0.5, 0.5);
        cairo_restore(cr);
    });
}

}  // namespace kv::plot
