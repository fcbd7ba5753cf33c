// Axis ticks at round values: linear axes step by 1, 2 or 5 times a power of ten; log2 axes
// put a tick on every power of two in range (thinned to every 2nd, 4th, ... when crowded).
#pragma once

#include <string>
#include <vector>

namespace kv::plot {

struct Ticks {
    double lo = 0, hi = 1;          // the axis range, widened to whole ticks (linear axes)
    std::vector<double> values;     // tick positions, increasing, within [lo, hi]
};

// At most about `max_ticks` ticks covering [lo, hi] (lo == hi is widened around the value).
Ticks linear_ticks(double lo, double hi, int max_ticks = 6);
// As linear_ticks, on an axis of whole numbers (layers): a step below 1 becomes 1.
Ticks integer_ticks(double lo, double hi, int max_ticks = 6);
// Powers of two within [lo, hi] (lo > 0); the range is kept as given.
Ticks log2_ticks(double lo, double hi, int max_ticks = 8);
// A log2 axis' ticks: every distinct value in `data` when there are at most `max_values` of them
// (so 768 or 1536 get a label), else the powers of two in [lo, hi]; the range is [lo, hi].
Ticks log2_data_ticks(std::vector<double> data, double lo, double hi, size_t max_values = 10);
// Short label: "0.25", "512", "1.5e+06", "4096".
std::string tick_label(double v);

}  // namespace kv::plot
