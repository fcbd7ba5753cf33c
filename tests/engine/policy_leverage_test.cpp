// leverage against kvpress' LeverageScorePress in f64: per (b, g) row, the cached keys centred
// over the sequence, sketched on the right by the documented Gaussian Phi (docs/POLICIES.md
// #leverage: Box-Muller over splitmix64 of (layer, head, index), / sqrt(k)), leverage
// y^T (Y^T Y + 0.01 I)^-1 y by an explicit Gauss-Jordan inverse, clamped at 0, z-normalised
// over the layer (unbiased std). The harness feeds unrotated keys (no RoPE frequencies).
#include "policy_references.h"

#include <array>

#include "engine/kv/policies/policy_leverage.h"
#include "engine/kv/policies/policy_math.h"

namespace kv::test {
namespace {

TEST(Leverage, SketchedScoresAndChoicesEqualTheF64Reference) {
    // kvpress' sketch of 48 columns over 16-dimensional keys (rank 16: the 0.01 ridge matters)
    check_policy_against_reference("leverage-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 48); },
                                   {4, 3, 4, 2, 4, 1, 5, 1}, 2e-5);
}

TEST(Leverage, SmallSketchAndNoSketchEqualTheF64Reference) {
    check_policy_against_reference(
        "leverage-default", [](KVCacheConfig& c) { c.policy_options = {{"leverage_sketch", 6}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 6); }, {4, 3, 4, 2}, 2e-5);
    check_policy_against_reference(
        "leverage-default", [](KVCacheConfig& c) { c.policy_options = {{"leverage_sketch", 0}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 0); }, {4, 3, 4, 2}, 2e-5);
}


TEST(Leverage, TriangularProductsGiveTheBitsOfTheWholeProducts) {
    // LeverageSketch::leverage computes Y^T Y up to its diagonal blocks and Y L^-T without the
    // zero half of L^-T; the same steps with whole products in plain loops (each sum over its
    // index in order, as policy_matmul_fma: fused multiply-adds where the CPU has FMA) must give
    // the same bits, so no decision moves
    const bool fused = policy_matmul_level() >= 3;
    auto mac = [fused](double a, double b, double s) { return fused ? std::fma(a, b, s) : s + a * b; };
    for (int64_t K : {48, 20, 7}) {
        std::mt19937_64 rng{uint64_t(K)};
        std::uniform_real_distribution<double> u(-3.0, 3.0);
        const int64_t rowsN = 61;
        std::vector<double> proj((size_t)(rowsN * K));
        for (double& x : proj) x = u(rng);
        std::vector<int32_t> idx;
        for (int32_t i = 0; i < rowsN; i += 1 + int32_t(i % 3)) idx.push_back(i);
        const int64_t m = int64_t(idx.size());
        LeverageSketch sk;
        std::vector<double> got((size_t)m);
        sk.leverage(proj.data(), idx.data(), m, K, got.data());
        std::vector<double> mean((size_t)K, 0.0), Y((size_t)(m * K)), G((size_t)(K * K), 0.0), Li((size_t)(K * K), 0.0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < K; ++c) mean[size_t(c)] += proj[size_t(idx[size_t(i)] * K + c)];
        for (double& x : mean) x /= double(m);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < K; ++c) Y[size_t(i * K + c)] = proj[size_t(idx[size_t(i)] * K + c)] - mean[size_t(c)];
        for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < K; ++b) {
                double s = 0;
                for (int64_t i = 0; i < m; ++i) s = mac(Y[size_t(i * K + a)], Y[size_t(i * K + b)], s);
                G[size_t(a * K + b)] = s + (a == b ? 1e-2 : 0.0);
            }
        for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b <= a; ++b) {
                double s = G[size_t(a * K + b)];
                for (int64_t c = 0; c < b; ++c) s -= G[size_t(a * K + c)] * G[size_t(b * K + c)];
                G[size_t(a * K + b)] = a == b ? std::sqrt(std::max(s, 1e-300)) : s / G[size_t(b * K + b)];
            }
        for (int64_t c = 0; c < K; ++c)
            for (int64_t a = c; a < K; ++a) {
                double s = a == c ? 1.0 : 0.0;
                for (int64_t b = c; b < a; ++b) s -= G[size_t(a * K + b)] * Li[size_t(b * K + c)];
                Li[size_t(a * K + c)] = s / G[size_t(a * K + a)];
            }
        for (int64_t i = 0; i < m; ++i) {
            double l = 0;
            for (int64_t a = 0; a < K; ++a) {
                double z = 0;
                for (int64_t b = 0; b < K; ++b) z = mac(Y[size_t(i * K + b)], Li[size_t(a * K + b)], z);
                l += z * z;
            }
            EXPECT_EQ(got[size_t(i)], std::max(l, 0.0)) << "K " << K << " row " << i;
        }
    }
}

// y^T (Y^T Y + 0.01 I)^-1 y for each row of Y (m x k) by Gaussian elimination in f64.
std::vector<double> ridge_leverage(const std::vector<double>& Y, int64_t m, int64_t k) {
    std::vector<double> G((size_t)(k * k), 0.0);
    for (int64_t a = 0; a < k; ++a)
        for (int64_t b = 0; b < k; ++b) {
            for (int64_t i = 0; i < m; ++i) G[size_t(a * k + b)] += Y[size_t(i * k + a)] * Y[size_t(i * k + b)];
            if (a == b) G[size_t(a * k + b)] += 1e-2;
        }
    std::vector<double> out((size_t)m);
    for (int64_t i = 0; i < m; ++i) {  // solve G x = y_i, then y_i . x
        std::vector<double> M = G, x(Y.begin() + i * k, Y.begin() + (i + 1) * k);
        for (int64_t c = 0; c < k; ++c)
            for (int64_t r = c + 1; r < k; ++r) {
                const double f = M[size_t(r * k + c)] / M[size_t(c * k + c)];
                for (int64_t d = c; d < k; ++d) M[size_t(r * k + d)] -= f * M[size_t(c * k + d)];
                x[size_t(r)] -= f * x[size_t(c)];
            }
        for (int64_t c = k - 1; c >= 0; --c) {
            for (int64_t d = c + 1; d < k; ++d) x[size_t(c)] -= M[size_t(c * k + d)] * x[size_t(d)];
            x[size_t(c)] /= M[size_t(c * k + c)];
        }
        double l = 0;
        for (int64_t c = 0; c < k; ++c) l += Y[size_t(i * k + c)] * x[size_t(c)];
        out[size_t(i)] = l;
    }
    return out;
}

TEST(Leverage, AWideSketchsFactorGivesTheSketchsLeverage) {
    // k > D: the sketch is applied as the D x D Cholesky factor U of Phi Phi^T (push-through: the
    // same leverage); against the leverage of (X - mean) Phi itself, with the sketch's own Phi
    for (auto [D, k, m] : std::vector<std::array<int64_t, 3>>{{8, 20, 40}, {16, 48, 61}, {5, 6, 9}}) {
        LeverageSketch sk;
        sk.k = k;
        sk.init(3, 2, D);
        ASSERT_TRUE(sk.factored(D));
        ASSERT_EQ(sk.width(D), D);
        std::mt19937_64 rng{uint64_t(D * 100 + k)};
        std::normal_distribution<double> g(0.0, 1.0);
        std::vector<float> keys((size_t)(m * D));
        for (int64_t i = 0; i < m; ++i)
            for (int64_t d = 0; d < D; ++d) keys[size_t(i * D + d)] = float(g(rng) * (1.0 + double(d)) + (d == 1 ? 6.0 : 0.0));
        const int64_t row = 1, G = 2;  // head 1 of 2: its own Phi
        std::vector<double> proj((size_t)(G * m * D));
        for (int64_t i = 0; i < m; ++i) sk.stage(keys.data() + i * D, D, nullptr, double(i), row, i);
        sk.flush(D, G, m, proj.data());
        std::vector<int32_t> idx((size_t)m);
        for (int64_t i = 0; i < m; ++i) idx[size_t(i)] = int32_t(i);
        std::vector<double> got((size_t)m);
        sk.leverage(proj.data() + row * m * D, idx.data(), m, D, got.data());
        std::vector<double> mean((size_t)D, 0.0), Y((size_t)(m * k), 0.0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t d = 0; d < D; ++d) mean[size_t(d)] += double(keys[size_t(i * D + d)]) / double(m);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t c = 0; c < k; ++c)
                for (int64_t d = 0; d < D; ++d)
                    Y[size_t(i * k + c)] += (double(keys[size_t(i * D + d)]) - mean[size_t(d)]) * sk.phi[size_t((row * D + d) * k + c)];
        const std::vector<double> ref = ridge_leverage(Y, m, k);
        for (int64_t i = 0; i < m; ++i) EXPECT_NEAR(got[size_t(i)], ref[size_t(i)], 1e-9 * std::max(1.0, ref[size_t(i)])) << "D " << D << " k " << k << " row " << i;
    }
}

TEST(Leverage, AChunksRotationsByAngleAdditionMatchTheDirectOnes) {
    // positions past a chunk's first take cos / sin by angle addition from the first's and the
    // offset's: the un-rotated keys (no sketch: kept as they are) against R(p)^T from std::cos
    // and std::sin of p theta, over runs long enough for the angles to wrap many times
    const int64_t D = 16, half = 8, n = 300;
    std::vector<double> rope((size_t)half);
    for (int64_t j = 0; j < half; ++j) rope[size_t(j)] = std::pow(10000.0, -double(2 * j) / double(D));
    LeverageSketch sk;
    sk.k = 0;
    sk.init(0, 1, D);
    std::mt19937_64 rng{5};
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    std::vector<float> keys((size_t)(n * D));
    for (float& x : keys) x = float(u(rng));
    for (int64_t p0 : {int64_t(0), int64_t(4000), int64_t(123457)}) {
        std::vector<double> proj((size_t)(n * D));
        for (int64_t i = 0; i < n; ++i) sk.stage(keys.data() + i * D, D, &rope, double(p0 + i), 0, i);
        sk.flush(D, 1, n, proj.data());
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < half; ++j) {
                const double a = double(p0 + i) * rope[size_t(j)], c = std::cos(a), s = std::sin(a);
                const double x = double(keys[size_t(i * D + j)]), y = double(keys[size_t(i * D + j + half)]);
                // the direct angle p theta is itself rounded (|p theta| 2^-53): both within a few
                // of those roundings of the exact rotation
                const double tol = 8.0 * 0x1p-53 * (std::fabs(a) + 1.0) * (std::fabs(x) + std::fabs(y));
                EXPECT_NEAR(proj[size_t(i * D + j)], x * c + y * s, tol) << "p " << p0 + i << " pair " << j;
                EXPECT_NEAR(proj[size_t(i * D + j + half)], y * c - x * s, tol) << "p " << p0 + i << " pair " << j;
            }
    }
}

}  // namespace
}  // namespace kv::test
