// What a figure shows, as plain data: panels (facets) side by side, each with named series of
// (x, y) points and horizontal reference lines, sharing the axis titles and scales. The plot
// module knows nothing of kvlab runs; callers turn their data into this.
#pragma once

#include <string>
#include <vector>

namespace kv::plot {

struct Series {
    std::string label;          // legend entry
    std::vector<double> x, y;   // same length; drawn in increasing x
    std::vector<double> se = {};  // empty, or per point a standard error, drawn as a bar of +-se where > 0
};

struct ReferenceLine {
    std::string label;  // legend entry, e.g. "dense"
    double y = 0;
};

struct Panel {
    std::string title;  // facet value ("" for a single panel)
    std::vector<Series> series;
    std::vector<ReferenceLine> references;
};

struct Figure {
    std::string title;
    std::string x_title, y_title;  // with units, e.g. "cache length (slots per layer)"
    bool log2_x = false;           // x on a log2 scale (x must be > 0)
    bool integer_x = false;        // x counts whole things (layers): ticks on whole numbers only
    std::vector<std::string> notes;  // lines under the x title: what splits the lines, what bars mean
    std::vector<Panel> panels;
    double panel_width = 360, panel_height = 270;  // points (1/72 inch)
};

}  // namespace kv::plot
