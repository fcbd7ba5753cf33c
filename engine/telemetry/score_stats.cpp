// Score summary statistics (see score_stats.h): one pass for min/max/mean/variance in double,
// nth_element on a thread-local scratch copy for the quantiles.
#include "score_stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace kv::trace {

namespace {
// Nearest-rank quantile of a partially ordered sample: the value at index floor(q * (n - 1)).
float quantile(std::vector<float>& v, double q) {
    size_t k = size_t(q * double(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(k), v.end());
    return v[k];
}
}  // namespace

ScoreStats score_stats(const float* values, size_t n) {
    ScoreStats s;
    double sum = 0, sum2 = 0;
    float lo = INFINITY, hi = -INFINITY;
    int64_t count = 0;
    for (size_t i = 0; i < n; ++i) {
        float x = values[i];
        if (!std::isfinite(x)) continue;
        ++count;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        sum += x;
        sum2 += double(x) * x;
    }
    s.count = count;
    s.nonfinite = int64_t(n) - count;
    if (count == 0) return s;
    double mean = sum / double(count);
    double var = std::max(0.0, sum2 / double(count) - mean * mean);
    s.min = lo;
    s.max = hi;
    s.mean = float(mean);
    s.stddev = float(std::sqrt(var));

    thread_local std::vector<float> scratch;
    scratch.clear();
    size_t stride = n > kExactQuantileLimit ? n / kExactQuantileLimit : 1;
    scratch.reserve(std::min(n, kExactQuantileLimit + 1));
    for (size_t i = 0; i < n; i += stride)
        if (std::isfinite(values[i])) scratch.push_back(values[i]);
    if (scratch.empty()) return s;
    // Ascending order of the requested quantiles lets each nth_element work on a smaller range
    // in practice (the array is already partitioned around the previous pivot).
    s.p10 = quantile(scratch, 0.10);
    s.p50 = quantile(scratch, 0.50);
    s.p90 = quantile(scratch, 0.90);
    s.p99 = quantile(scratch, 0.99);
    return s;
}

}  // namespace kv::trace
