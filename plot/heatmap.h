// A grid of cells coloured by a value in [lo, hi] (the needle-in-a-haystack map: depth x
// length, colour = the share of needles found), one panel per entry side by side on one colour
// scale, each cell labelled with its value, a colour bar at the right. Plain data, as figure.h.
#pragma once

#include <string>
#include <vector>

namespace kv::plot {

struct HeatmapPanel {
    std::string title;
    std::vector<std::vector<double>> values;  // [row][column]; NaN: no data (drawn grey, unlabelled)
};

struct Heatmap {
    std::string title, x_title, y_title, value_title;
    std::vector<std::string> x_labels;  // one per column, left to right
    std::vector<std::string> y_labels;  // one per row, top to bottom
    std::vector<HeatmapPanel> panels;
    double lo = 0, hi = 1;  // the colour scale: lo red, the middle yellow, hi green
};

// The colour of value v on [lo, hi] (clamped), as r, g, b in 0..1.
void heatmap_colour(double v, double lo, double hi, double rgb[3]);

// SVG, PNG or PDF by the extension (figure_format). Throws std::invalid_argument for an unknown
// extension or a panel whose grid does not match the labels, std::runtime_error when the file
// cannot be written.
void render_heatmap(const Heatmap& h, const std::string& path);

}  // namespace kv::plot
