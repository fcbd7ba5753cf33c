// leverage against kvpress' LeverageScorePress in f64: per (b, g) row, the cached keys centred
// over the sequence, sketched on the right by the documented Gaussian Phi (docs/POLICIES.md
// #leverage: Box-Muller over splitmix64 of (layer, head, index), / sqrt(k)), leverage
// y^T (Y^T Y + 0.01 I)^-1 y by an explicit Gauss-Jordan inverse, clamped at 0, z-normalised
// over the layer (unbiased std). The harness feeds unrotated keys (no RoPE frequencies).
#include "policy_references.h"

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

}  // namespace
}  // namespace kv::test
