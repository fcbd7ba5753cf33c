// Round tick values (see ticks.h).
#include "ticks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kv::plot {

Ticks linear_ticks(double lo, double hi, int max_ticks) {
    if (hi < lo) std::swap(lo, hi);
    if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {  // one value: a range around it
        const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
        lo -= pad;
        hi += pad;
    }
    const double raw = (hi - lo) / std::max(1, max_ticks - 1);
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag * 10;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) {
            step = m * mag;
            break;
        }
    Ticks t;
    t.lo = std::floor(lo / step + 1e-9) * step;
    t.hi = std::ceil(hi / step - 1e-9) * step;
    for (double v = t.lo; v <= t.hi + step * 1e-6; v += step) t.values.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    return t;
}

Ticks integer_ticks(double lo, double hi, int max_ticks) {
    Ticks t = linear_ticks(lo, hi, max_ticks);
    if (t.values.size() >= 2 && t.values[1] - t.values[0] >= 1) return t;  // 1, 2, 5 x 10^k: whole already
    Ticks u;
    u.lo = std::floor(t.lo + 1e-9);
    u.hi = std::ceil(t.hi - 1e-9);
    for (double v = u.lo; v <= u.hi; v += 1) u.values.push_back(v);
    return u;
}

Ticks log2_ticks(double lo, double hi, int max_ticks) {
    if (hi < lo) std::swap(lo, hi);
    Ticks t;
    t.lo = lo;
    t.hi = hi;
    const int e0 = int(std::ceil(std::log2(lo) - 1e-9)), e1 = int(std::floor(std::log2(hi) + 1e-9));
    int every = 1;
    while ((e1 - e0) / every + 1 > max_ticks) every *= 2;
    for (int e = e0; e <= e1; ++e)
        if ((e - e0) % every == 0) t.values.push_back(std::ldexp(1.0, e));
    return t;
}

Ticks log2_data_ticks(std::vector<double> data, double lo, double hi, size_t max_values) {
    std::sort(data.begin(), data.end());
    data.erase(std::unique(data.begin(), data.end()), data.end());
    if (data.empty() || data.size() > max_values) return log2_ticks(lo, hi);
    Ticks t;
    t.lo = std::min(lo, hi);
    t.hi = std::max(lo, hi);
    for (double v : data)
        if (v >= t.lo && v <= t.hi) t.values.push_back(v);
    return t;
}

std::string tick_label(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

}  // namespace kv::plot
