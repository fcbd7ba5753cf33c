// ea_key_forms (engine/kv/policies/policy_expected_attention_math.h), expected-attention's per-key terms
// k.mu' and k^T Sigma' k from the upper triangle of Sigma': every ISA path this CPU runs against
// an f64 reference, bit-identical across paths, and equal to the form it replaced (the full f32
// product K . Sigma' followed by an f64 dot with each key) to f32 rounding.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_expected_attention_math.h"
#include "engine/kv/policies/policy_math.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

constexpr double kEps32 = 6e-8;  // f32 unit roundoff, rounded up

// T keys of D (stride D + 3), R symmetric D x D matrices S (f32, full) and their halved upper
// triangles U side by side (stride R D + 5; the padding is NaN, so a read past a head's columns
// shows), R means of D in f64.
struct Case {
    int64_t T, D, R, ldk, ldu;
    std::vector<float> K, S, U;
    std::vector<double> M;
    Case(int64_t T_, int64_t D_, int64_t R_, std::mt19937_64& rng) : T(T_), D(D_), R(R_), ldk(D_ + 3), ldu(R_ * D_ + 5) {
        std::uniform_real_distribution<double> u(-1.0, 1.0);
        K.assign(size_t(T * ldk), std::numeric_limits<float>::quiet_NaN());
        for (int64_t j = 0; j < T; ++j)
            for (int64_t d = 0; d < D; ++d) K[size_t(j * ldk + d)] = float(2.0 * u(rng));
        S.assign(size_t(R * D * D), 0.0f);
        U.assign(size_t(D * ldu), std::numeric_limits<float>::quiet_NaN());
        for (int64_t h = 0; h < R; ++h)
            for (int64_t d = 0; d < D; ++d)
                for (int64_t e = d; e < D; ++e) {
                    const float x = float(u(rng));
                    S[size_t((h * D + d) * D + e)] = S[size_t((h * D + e) * D + d)] = x;
                }
        for (int64_t d = 0; d < D; ++d)
            for (int64_t h = 0; h < R; ++h)
                for (int64_t e = 0; e < D; ++e) {
                    const float x = S[size_t((h * D + d) * D + e)];
                    U[size_t(d * ldu + h * D + e)] = e < d ? 0.0f : e == d ? x / 2.0f : x;
                }
        M.resize(size_t(R * D));
        for (double& x : M) x = 3.0 * u(rng);
    }
    void run(int level, std::vector<double>& lin, std::vector<double>& quad, bool with_quad = true) const {
        lin.assign(size_t(R * T), -1.0), quad.assign(size_t(R * T), -1.0);
        ea_key_forms_at(level, T, D, R, K.data(), ldk, U.data(), ldu, M.data(), lin.data(), with_quad ? quad.data() : nullptr);
    }
    float k(int64_t j, int64_t d) const { return K[size_t(j * ldk + d)]; }
    float s(int64_t h, int64_t d, int64_t e) const { return S[size_t((h * D + d) * D + e)]; }
};

std::vector<int> levels() {
    std::vector<int> l{0};  // the plain loops
    for (int level = 2; level <= policy_matmul_level(); ++level) l.push_back(level);
    return l;
}

// (T, D, R): full row tiles and tails, D = 64 (SmolLM2) and 16 (the tiny model), widths that
// fill one, two or four vectors of a level, and D not a multiple of 8 or of the vector width;
// D = 32 (the small model) with T a multiple of the 4-key tile and not
const std::vector<std::array<int64_t, 3>> kShapes = {{1, 16, 1}, {5, 16, 3}, {13, 64, 3}, {64, 64, 3}, {7, 24, 2},  {9, 12, 2},
                                                     {6, 40, 1}, {4, 128, 2}, {37, 32, 4}, {32, 32, 4}, {21, 24, 2}, {50, 8, 1}, {17, 40, 3}};

TEST(ExpectedAttentionKeyForms, EveryIsaPathEqualsTheF64Reference) {
    std::mt19937_64 rng(seed_for("ExpectedAttentionKeyForms.F64"));
    for (const auto& [T, D, R] : kShapes) {
        const Case c(T, D, R, rng);
        for (int level : levels()) {
            std::vector<double> lin, quad;
            c.run(level, lin, quad);
            for (int64_t h = 0; h < R; ++h)
                for (int64_t j = 0; j < T; ++j) {
                    double l = 0, lmag = 0, q = 0, qmag = 0;
                    for (int64_t d = 0; d < D; ++d) {
                        l += double(c.k(j, d)) * c.M[size_t(h * D + d)];
                        lmag += std::fabs(double(c.k(j, d)) * c.M[size_t(h * D + d)]);
                        for (int64_t e = 0; e < D; ++e) {
                            const double p = double(c.k(j, d)) * double(c.s(h, d, e)) * double(c.k(j, e));
                            q += p, qmag += std::fabs(p);
                        }
                    }
                    const std::string at = "level " + std::to_string(level) + " T " + std::to_string(T) + " D " + std::to_string(D) +
                                           " head " + std::to_string(h) + " key " + std::to_string(j);
                    ASSERT_NEAR(lin[size_t(h * T + j)], l, 4.0 * double(D) * 1.2e-16 * lmag + 1e-300) << at;
                    // each f32 partial sum over d <= e carries at most (e + 1) roundings
                    ASSERT_NEAR(quad[size_t(h * T + j)], q, 2.0 * double(D + 2) * kEps32 * qmag) << at;
                }
        }
    }
}

TEST(ExpectedAttentionKeyForms, EveryIsaPathGivesBitIdenticalForms) {
    // every sum runs in one fixed order at every level: scores must not depend on the CPU
    std::mt19937_64 rng(seed_for("ExpectedAttentionKeyForms.Bits"));
    for (const auto& [T, D, R] : kShapes) {
        const Case c(T, D, R, rng);
        std::vector<double> lin0, quad0, lin, quad;
        c.run(0, lin0, quad0);
        for (int level : levels()) {
            c.run(level, lin, quad);
            EXPECT_EQ(lin, lin0) << "level " << level << " T " << T << " D " << D;
            EXPECT_EQ(quad, quad0) << "level " << level << " T " << T << " D " << D;
            c.run(level, lin, quad, false);  // mean only: quad untouched
            EXPECT_EQ(lin, lin0) << "level " << level << " T " << T << " D " << D;
            for (double x : quad) ASSERT_EQ(x, -1.0) << "quad written without a covariance, level " << level;
        }
    }
}

TEST(ExpectedAttentionKeyForms, HalfFormEqualsTheFullProductItReplaced) {
    // the form before: KS = K . [S_1 .. S_R] as one f32 product, then quad = sum_d k_d KS_d in
    // f64 (d ascending), lin likewise; SmolLM2's shape (256 slots, D 64, 3 query heads per KV head)
    std::mt19937_64 rng(seed_for("ExpectedAttentionKeyForms.Old"));
    const Case c(256, 64, 3, rng);
    const int64_t T = c.T, D = c.D, R = c.R;
    std::vector<float> Sp((size_t)(D * R * D)), KS((size_t)(T * R * D));
    for (int64_t d = 0; d < D; ++d)
        for (int64_t h = 0; h < R; ++h)
            for (int64_t e = 0; e < D; ++e) Sp[size_t(d * R * D + h * D + e)] = c.s(h, d, e);
    policy_matmul(T, R * D, D, c.K.data(), c.ldk, Sp.data(), R * D, KS.data(), R * D);
    std::vector<double> lin, quad;
    c.run(4, lin, quad);
    for (int64_t h = 0; h < R; ++h)
        for (int64_t j = 0; j < T; ++j) {
            double l = 0, lmag = 0, q = 0, qmag = 0;
            for (int64_t d = 0; d < D; ++d) {
                l += double(c.k(j, d)) * c.M[size_t(h * D + d)];
                lmag += std::fabs(double(c.k(j, d)) * c.M[size_t(h * D + d)]);
                q += double(c.k(j, d)) * double(KS[size_t(j * R * D + h * D + d)]);
                for (int64_t e = 0; e < D; ++e) qmag += std::fabs(double(c.k(j, d)) * double(c.s(h, d, e)) * double(c.k(j, e)));
            }
            ASSERT_NEAR(lin[size_t(h * T + j)], l, 4.0 * double(D) * 1.2e-16 * lmag) << "head " << h << " key " << j;
            // both forms are within (D + 2) f32 roundings of the exact value
            ASSERT_NEAR(quad[size_t(h * T + j)], q, 4.0 * double(D + 2) * kEps32 * qmag) << "head " << h << " key " << j;
        }
}

TEST(ExpectedAttentionMoments, UpperTriangleEqualsTheOrderedSumsAndTheFullProduct) {
    // every upper entry (e >= d) must be S2 + (the sum over rows in order) bit for bit, at every
    // level, and what the full product the policy used before gives there
    std::mt19937_64 rng(seed_for("ExpectedAttentionMoments.Upper"));
    std::uniform_real_distribution<double> u(-2.0, 2.0);
    for (auto [m, D] : {std::array<int64_t, 2>{64, 64}, {5, 16}, {13, 24}, {1, 12}, {7, 40}, {3, 128}}) {
        std::vector<double> X(size_t(m * D)), S0(size_t(D * D)), Xt(size_t(D * m));
        for (double& x : X) x = u(rng);
        for (double& x : S0) x = u(rng);
        for (int64_t t = 0; t < m; ++t)
            for (int64_t d = 0; d < D; ++d) Xt[size_t(d * m + t)] = X[size_t(t * D + d)];
        std::vector<double> full = S0;
        policy_matmul(D, D, m, Xt.data(), m, X.data(), D, full.data(), D, true);
        for (int level : levels()) {
            std::vector<double> S = S0;
            ea_moments_upper_at(level, m, D, X.data(), S.data());
            for (int64_t d = 0; d < D; ++d)
                for (int64_t e = d; e < D; ++e) {
                    double sum = 0;
                    for (int64_t t = 0; t < m; ++t) sum += X[size_t(t * D + d)] * X[size_t(t * D + e)];
                    const size_t at = size_t(d * D + e);
                    ASSERT_EQ(S[at], S0[at] + sum) << "level " << level << " m " << m << " D " << D << " at (" << d << ", " << e << ")";
                    ASSERT_EQ(S[at], full[at]) << "level " << level << " m " << m << " D " << D << " at (" << d << ", " << e << ")";
                }
        }
    }
}

}  // namespace
}  // namespace kv::test
