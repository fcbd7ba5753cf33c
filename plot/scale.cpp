// Axis scales (see scale.h).
#include "scale.h"

#include <cmath>

namespace kv::plot {

double Scale::operator()(double v) const {
    const double a = log2 ? std::log2(lo) : lo, b = log2 ? std::log2(hi) : hi, x = log2 ? std::log2(v) : v;
    const double f = b == a ? 0.5 : (x - a) / (b - a);
    return px0 + f * (px1 - px0);
}

}  // namespace kv::plot
