// TurboQuant rows (kernels/common/quant_formats.h TQK/TQV, codebook kernels/common/lloyd_max.h)
// against definitions written here in f64: the key codebook equals a Lloyd-Max run over the
// density of a rotated unit vector's coordinate (per-cell Simpson integrals, another start) and,
// for large rows, Max's (1960) Gaussian levels; the rotation is H S x / sqrt(n) with Sylvester's
// H and splitmix64 signs; every key coordinate decodes to the level nearest its rotated value and
// the stored factor keeps the row's norm, a decoded row codes to the same codes, and the mean
// squared error is the codebook's distortion; values stay within half a step per
// rotated coordinate; row bytes follow the layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

// Lloyd-Max for f(t) = (1 - t^2)^((d - 3) / 2) on (-1, 1): a cell's mass by composite Simpson
// (600 panels, outer cells cut at 20 sigma), its first moment in closed form
// (-(1 - t^2)^(e + 1) / (2 (e + 1))), levels started on a wider uniform grid.
std::vector<double> lloyd_max_f64(int64_t d, int bits, double* distortion = nullptr) {
    const int K = 1 << bits;
    const double sigma = 1.0 / std::sqrt(double(d)), e = (double(d) - 3.0) / 2.0, edge = std::min(1.0, 20.0 * sigma);
    auto f = [&](double t) { return std::fabs(t) >= 1.0 ? 0.0 : std::pow(1.0 - t * t, e); };
    auto simpson = [&](double lo, double hi, int p, auto&& g) {
        const int m = 600;
        const double h = (hi - lo) / m;
        double s = 0;
        for (int i = 0; i <= m; ++i) {
            const double t = lo + h * i;
            s += (i == 0 || i == m ? 1 : (i % 2 ? 4 : 2)) * f(t) * g(t);
        }
        (void)p;
        return s * h / 3.0;
    };
    std::vector<double> c(static_cast<size_t>(K));
    for (int k = 0; k < K; ++k) c[size_t(k)] = sigma * 4.0 * (2.0 * (k + 0.5) / K - 1.0);
    auto bounds = [&](int k, double& lo, double& hi) {
        lo = k == 0 ? -edge : 0.5 * (c[size_t(k - 1)] + c[size_t(k)]);
        hi = k == K - 1 ? edge : 0.5 * (c[size_t(k)] + c[size_t(k + 1)]);
    };
    for (int it = 0; it < 20000; ++it) {
        std::vector<double> nc(static_cast<size_t>(K));
        double moved = 0;
        for (int k = 0; k < K; ++k) {
            double lo, hi;
            bounds(k, lo, hi);
            auto prim = [&](double t) { return -std::pow(std::max(0.0, 1.0 - t * t), e + 1.0) / (2.0 * (e + 1.0)); };
            const double m0 = simpson(lo, hi, 0, [](double) { return 1.0; }), m1 = prim(hi) - prim(lo);
            nc[size_t(k)] = m1 / m0;
            moved = std::max(moved, std::fabs(nc[size_t(k)] - c[size_t(k)]));
        }
        c = nc;
        if (moved < 1e-11 * sigma) break;
    }
    if (distortion) {  // E[(t - Q(t))^2] per coordinate
        double z = 0, s = 0;
        for (int k = 0; k < K; ++k) {
            double lo, hi;
            bounds(k, lo, hi);
            const double ck = c[size_t(k)];
            z += simpson(lo, hi, 0, [](double) { return 1.0; });
            s += simpson(lo, hi, 2, [&](double t) { return (t - ck) * (t - ck); });
        }
        *distortion = s / z;
    }
    return c;
}

// The rotation y = H S x / sqrt(n): S's signs the low bits of successive splitmix64 outputs
// from the format's seed, H[i][j] = (-1)^popcount(i & j).
std::vector<double> rotate(const std::vector<double>& x) {
    const size_t n = x.size();
    std::vector<double> sx(n), y(n, 0.0);
    uint64_t state = kTurboQuantSeed;
    for (size_t i = 0; i < n; ++i) {
        state += 0x9e3779b97f4a7c15ull;
        uint64_t z = state;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        sx[i] = (z & 1 ? -1.0 : 1.0) * x[i];
    }
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) y[i] += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * sx[j];
        y[i] /= std::sqrt(double(n));
    }
    return y;
}

QuantFormat key_format(int bits) { return bits == 2 ? QuantFormat::TQK2 : bits == 3 ? QuantFormat::TQK3 : QuantFormat::TQK4; }

TEST(TurboQuant, KeyCodebookEqualsLloydMaxInF64) {
    for (int64_t d : {16, 64, 128, 256})
        for (int bits : {2, 3, 4}) {
            const std::vector<double> want = lloyd_max_f64(d, bits);
            const QuantLevels got = ops::quant_levels(key_format(bits), d);
            const double sigma = 1.0 / std::sqrt(double(d));
            for (int k = 0; k < (1 << bits); ++k)
                EXPECT_NEAR(double(got.v[k]), want[size_t(k)], 2e-6 * sigma) << "d " << d << " bits " << bits << " level " << k;
        }
}

TEST(TurboQuant, LargeRowsApproachMaxsGaussianLevels) {
    // Max (1960), optimum quantizers of N(0, 1): the positive levels for 4, 8 and 16 levels.
    const std::vector<std::vector<double>> max1960 = {
        {0.4528, 1.5104}, {0.2451, 0.7560, 1.3440, 2.1520}, {0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326}};
    const int64_t d = 4096;
    for (int bits : {2, 3, 4}) {
        const QuantLevels got = ops::quant_levels(key_format(bits), d);
        const int K = 1 << bits;
        for (int k = 0; k < K / 2; ++k)
            EXPECT_NEAR(double(got.v[K / 2 + k]) * std::sqrt(double(d)), max1960[size_t(bits - 2)][size_t(k)], 2e-3 * (k + 1))
                << "bits " << bits << " level " << k;
    }
}

TEST(TurboQuant, KeysDecodeToTheNearestLevelWithTheCodebooksDistortion) {
    std::mt19937_64 rng(test::seed_for("turboquant keys"));
    for (int64_t n : {64, 128})
        for (int bits : {2, 3, 4}) {
            const QuantFormat f = key_format(bits);
            const QuantLevels lv = ops::quant_levels(f, n);
            double distortion = 0;
            lloyd_max_f64(n, bits, &distortion);
            ASSERT_EQ(quant_row_bytes(f, n), n * bits / 8 + 4);
            std::normal_distribution<double> nd(0.0, 1.0);
            double rel_mse = 0;
            const int rows = 1200;
            int recoded = 0, stable = 0;
            for (int r = 0; r < rows; ++r) {
                std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
                const double scale = std::exp(nd(rng));
                // odd rows with outliers (for the codes); even rows i.i.d. Gaussian, whose rotation
                // (orthogonal) is i.i.d. Gaussian too, so y / |y| is uniform on the sphere
                for (auto& v : x) v = float(nd(rng) * scale * (r % 2 && rng() % 9 == 0 ? 6.0 : 1.0));
                std::vector<uint8_t> q(size_t(quant_row_bytes(f, n)));
                quantize_row(f, x.data(), n, q.data(), lv.v);
                dequantize_row(f, q.data(), n, y.data(), lv.v);
                std::vector<double> xd(x.begin(), x.end()), yd(y.begin(), y.end());
                double norm = 0;
                for (double v : xd) norm += v * v;
                norm = std::sqrt(norm);
                float stored;
                std::memcpy(&stored, q.data() + n * bits / 8, 4);
                const std::vector<double> u = rotate(xd), uh = rotate(yd);  // S H = (H S)^-1: rotate the decoded row back
                double err = 0, cs = 0;
                bool clear = true;  // no coordinate within rounding of a decision boundary
                std::vector<int> best(size_t(n), 0);
                for (int64_t i = 0; i < n; ++i) {
                    const double ui = u[size_t(i)] / norm;
                    int& bi = best[size_t(i)];
                    for (int k = 1; k < (1 << bits); ++k)
                        if (std::fabs(ui - lv.v[k]) < std::fabs(ui - lv.v[bi])) bi = k;
                    for (int k = 1; k < (1 << bits); ++k) clear = clear && std::fabs(ui - 0.5 * (double(lv.v[k - 1]) + lv.v[k])) > 1e-5;
                    cs += double(lv.v[bi]) * double(lv.v[bi]);
                    err += (xd[size_t(i)] - yd[size_t(i)]) * (xd[size_t(i)] - yd[size_t(i)]);
                }
                if (clear) {
                    // the nearest levels, scaled so that the decoded row keeps |x|: g = |x| / |Q(u)|
                    const double g = norm / std::sqrt(cs);
                    ASSERT_NEAR(double(stored), g, 1e-5 * g) << "n " << n << " bits " << bits << " row " << r;
                    for (int64_t i = 0; i < n; ++i)
                        ASSERT_NEAR(uh[size_t(i)] / g, double(lv.v[best[size_t(i)]]), 1e-5) << "n " << n << " bits " << bits << " row " << r << " i " << i;
                    // Coding the decoded row again (the working buffer's write-back) codes its own
                    // rotated coordinates Q(u) / |Q(u)| to their nearest levels; those are Q(u)'s
                    // codes again unless |Q(u)| is far enough from 1 to carry a level past a
                    // boundary (rows of mostly small coordinates: |Q(u)| down to 0.87 seen).
                    double ny = 0;
                    for (double v : yd) ny += v * v;
                    ny = std::sqrt(ny);
                    bool clear2 = true, same = true;
                    std::vector<int> best2(size_t(n), 0);
                    for (int64_t i = 0; i < n; ++i) {
                        const double vi = uh[size_t(i)] / ny;
                        int& bi = best2[size_t(i)];
                        for (int k = 1; k < (1 << bits); ++k)
                            if (std::fabs(vi - lv.v[k]) < std::fabs(vi - lv.v[bi])) bi = k;
                        for (int k = 1; k < (1 << bits); ++k) clear2 = clear2 && std::fabs(vi - 0.5 * (double(lv.v[k - 1]) + lv.v[k])) > 1e-5;
                        same = same && bi == best[size_t(i)];
                    }
                    if (clear2) {
                        std::vector<uint8_t> q2(q.size());
                        quantize_row(f, y.data(), n, q2.data(), lv.v);
                        for (int64_t i = 0; i < n; ++i)
                            ASSERT_EQ(int(tq_get_code(q2.data(), i, bits)), best2[size_t(i)]) << "re-coded coordinate " << i << ", row " << r;
                        ++recoded, stable += same;
                    }
                }
                if (r % 2 == 0) rel_mse += err / (norm * norm) / (rows / 2);
            }
            // |x - x^|^2 / |x|^2 = |u - Q(u) / |Q(u)||^2 = 2 - 2 u.Q / |Q| with u.Q ~ |Q|^2 ~ 1 - n D
            // (Lloyd-Max's centroid condition, D the per-coordinate distortion): 2 - 2 sqrt(1 - n D)
            const double want = 2.0 - 2.0 * std::sqrt(1.0 - double(n) * distortion);
            // The formula's approximations put n = 64 about 3% low; 600 rows add about +-2.5%.
            EXPECT_NEAR(rel_mse, want, 0.1 * want) << "n " << n << " bits " << bits << " (n D = " << double(n) * distortion << ")";
            EXPECT_GT(recoded, rows / 2) << "n " << n << " bits " << bits << ": too few rows re-coded";
            EXPECT_GE(stable, recoded - recoded / 50) << "n " << n << " bits " << bits << ": the write-back should keep 98% of rows' codes";
        }
}

TEST(TurboQuant, ValuesStayWithinHalfAStepPerRotatedCoordinate) {
    std::mt19937_64 rng(test::seed_for("turboquant values"));
    std::normal_distribution<double> nd(0.0, 1.0);
    for (QuantFormat f : {QuantFormat::TQV2, QuantFormat::TQV3, QuantFormat::TQV4, QuantFormat::TQV8})
        for (int64_t n : {16, 64, 256}) {
            const int bits = tq_bits(f);
            ASSERT_EQ(quant_row_bytes(f, n), n * bits / 8 + 8);
            for (int r = 0; r < 100; ++r) {
                std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
                for (auto& v : x) v = float(nd(rng) + 0.5);
                std::vector<uint8_t> q(size_t(quant_row_bytes(f, n)));
                quantize_row(f, x.data(), n, q.data());
                dequantize_row(f, q.data(), n, y.data());
                float lo, s;
                std::memcpy(&lo, q.data() + n * bits / 8, 4);
                std::memcpy(&s, q.data() + n * bits / 8 + 4, 4);
                const std::vector<double> u = rotate(std::vector<double>(x.begin(), x.end()));
                const std::vector<double> uh = rotate(std::vector<double>(y.begin(), y.end()));
                double umin = u[0], umax = u[0];
                for (double v : u) umin = std::min(umin, v), umax = std::max(umax, v);
                ASSERT_NEAR(double(lo), umin, 1e-5 * (1 + std::fabs(umin)));
                ASSERT_NEAR(double(s), (umax - umin) / ((1 << bits) - 1), 1e-5 * (umax - umin));
                for (int64_t i = 0; i < n; ++i)
                    ASSERT_LE(std::fabs(uh[size_t(i)] - u[size_t(i)]), 0.5 * double(s) * (1 + 1e-4) + 1e-5)
                        << ops::quant_format_name(f) << " n " << n << " row " << r << " coordinate " << i;
            }
        }
}

TEST(TurboQuant, RowsThatAreNotAPowerOfTwoAreRefused) {
    EXPECT_FALSE(quant_row_ok(QuantFormat::TQK4, 96));
    EXPECT_FALSE(quant_row_ok(QuantFormat::TQV4, 8));
    EXPECT_TRUE(quant_row_ok(QuantFormat::TQK3, 64));
    try {
        ops::quantize(Tensor::zeros({2, 96}, DType::F32), QuantFormat::TQK4);
        FAIL() << "a row of 96 accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("a power of two"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
