// A data-to-page mapping for one axis: linear or log2, from a data range to a pixel range
// (the pixel range may run backwards, as y does on a page).
#pragma once

namespace kv::plot {

struct Scale {
    double lo = 0, hi = 1;      // data range
    double px0 = 0, px1 = 1;    // page coordinates of lo and hi
    bool log2 = false;
    double operator()(double v) const;
};

}  // namespace kv::plot
