// The TurboQuant key codebook, computed rather than tabulated: after a random rotation each
// coordinate t of a unit vector in R^d has the density f(t) ~ (1 - t^2)^((d - 3) / 2) on
// (-1, 1) (about N(0, 1/d) for large d), the same for every coordinate, so one scalar
// Lloyd-Max quantizer of 2^b levels serves them all. Host only (the engine computes it once
// per row length and width and hands it to the kernels as QuantLevels).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace kv {

// Lloyd-Max iteration for f in f64: thresholds at the midpoints of neighbouring levels, each
// level the mean of f over its cell, until no level moves by more than 1e-14 / sqrt(d).
// Integrals: the density on 2^16 equal cells over [-a, a] (a = min(1, 14 / sqrt(d)); beyond it
// f < e^-90 of its peak), cell masses by the midpoint rule, a cell cut by a threshold split
// in proportion. Levels ascending, symmetric about 0.
inline std::vector<double> lloyd_max_sphere_levels(int64_t d, int bits) {
    const int K = 1 << bits;
    const int64_t N = int64_t(1) << 16;
    const double a = std::min(1.0, 14.0 / std::sqrt(double(d))), h = 2.0 * a / double(N);
    const double e = (double(d) - 3.0) / 2.0;
    // prefix sums of mass and first moment over whole cells
    std::vector<double> m0(size_t(N + 1), 0.0), m1(size_t(N + 1), 0.0);
    for (int64_t j = 0; j < N; ++j) {
        const double t = -a + (double(j) + 0.5) * h;
        const double w = std::exp(e * std::log1p(-t * t)) * h;
        m0[size_t(j + 1)] = m0[size_t(j)] + w;
        m1[size_t(j + 1)] = m1[size_t(j)] + w * t;
    }
    // mass and moment of (-a, x]: whole cells, then the part of the cut cell (its density constant)
    auto cum = [&](double x, double& c0, double& c1) {
        if (x <= -a) { c0 = c1 = 0.0; return; }
        if (x >= a) { c0 = m0[size_t(N)]; c1 = m1[size_t(N)]; return; }
        const double pos = (x + a) / h;
        const int64_t j = std::min<int64_t>(int64_t(pos), N - 1);
        const double frac = pos - double(j), left = -a + double(j) * h;
        const double w = m0[size_t(j + 1)] - m0[size_t(j)];
        c0 = m0[size_t(j)] + frac * w;
        c1 = m1[size_t(j)] + frac * w * (left + 0.5 * frac * h);
    };
    const double sigma = 1.0 / std::sqrt(double(d));
    std::vector<double> c(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) c[size_t(k)] = sigma * (-2.5 + 5.0 * (double(k) + 0.5) / double(K));
    for (int it = 0; it < 100000; ++it) {
        double moved = 0.0, p0 = 0.0, p1 = 0.0;
        std::vector<double> nc(static_cast<size_t>(K));
        for (int k = 0; k < K; ++k) {
            double q0, q1;
            if (k + 1 < K) cum(0.5 * (c[size_t(k)] + c[size_t(k + 1)]), q0, q1);
            else q0 = m0[size_t(N)], q1 = m1[size_t(N)];
            nc[size_t(k)] = q0 - p0 > 0.0 ? (q1 - p1) / (q0 - p0) : c[size_t(k)];
            moved = std::max(moved, std::fabs(nc[size_t(k)] - c[size_t(k)]));
            p0 = q0, p1 = q1;
        }
        c = nc;
        if (moved < 1e-14 * sigma) break;
    }
    return c;
}

}  // namespace kv
