// Series colours: a qualitative palette readable in print and by colour-blind readers
// (Okabe-Ito), cycled when there are more series.
#pragma once

#include <cstddef>

namespace kv::plot {

struct Rgb {
    double r, g, b;  // 0..1
};

Rgb series_color(size_t i);

}  // namespace kv::plot
