// Draws a Figure with cairo into an SVG, PNG or PDF file (chosen by the extension), one code
// path for all three: per panel a frame, round ticks, light grid lines, each series as a
// polyline with point markers, reference lines dashed; axis titles and one legend.
#pragma once

#include <string>

#include "figure.h"
#include "figure_file.h"  // figure_format

namespace kv::plot {

// Throws std::invalid_argument for an unknown extension or an empty / inconsistent figure,
// std::runtime_error when the file cannot be written.
void render_figure(const Figure& fig, const std::string& path);

}  // namespace kv::plot
