// Series styles: a qualitative palette readable in print and by colour-blind readers
// (Okabe-Ito, without black, which the reference lines use), combined with marker shapes and
// dash patterns so that no two of the first 35 series look alike even where colours repeat
// (and lines stay apart in greyscale print).
#pragma once

#include <cstddef>
#include <vector>

namespace kv::plot {

struct Rgb {
    double r, g, b;  // 0..1
};

enum class Marker { CIRCLE, SQUARE, TRIANGLE_UP, DIAMOND, TRIANGLE_DOWN };

struct SeriesStyle {
    Rgb color;
    std::vector<double> dash;  // cairo dash lengths in points; empty = solid
    Marker marker = Marker::CIRCLE;
};

// Colours cycle every 7 series, markers every 5 (so a (colour, marker) pair repeats only after
// 35), and each further group of 7 series gets the next dash pattern.
Rgb series_color(size_t i);
SeriesStyle series_style(size_t i);

}  // namespace kv::plot
