// One figure file drawn with cairo: the surface for the file's type (SVG, PDF, or PNG at twice
// the point size, sharp in documents), the caller's drawing, and every cairo failure turned into
// one message naming the file. Shared by the line figures (render.h) and heat maps (heatmap.h).
#pragma once

#include <cairo.h>

#include <functional>
#include <string>

namespace kv::plot {

// "svg", "png", "pdf" or "" for a path with another extension.
std::string figure_format(const std::string& path);

// Creates `path` (width x height points, type from figure_format(path), which the caller has
// checked) and calls draw on its canvas. Throws std::runtime_error when cairo cannot create,
// draw or write the file.
void write_figure_file(const std::string& path, double width, double height, const std::function<void(cairo_t*)>& draw);

// Draws s with its ink box aligned at (x, y): align 0 = left/top, 0.5 = centre, 1 = right/bottom.
void text_at(cairo_t* cr, const std::string& s, double x, double y, double align_x, double align_y);

}  // namespace kv::plot
