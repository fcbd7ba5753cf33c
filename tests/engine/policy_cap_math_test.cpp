// cap's per-head leverages (engine/kv/policies/policy_cap_math.h) at every ISA level this CPU
// runs, against the definition in f64 with an explicit inverse: A = I + sum c_i v_i v_i^T,
// l_i = v_i^T A^-1 v_i (Gauss-Jordan, not a Cholesky factor).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_cap_math.h"

namespace kv::test {
namespace {

std::vector<double> inverse(std::vector<double> A, int64_t D) {
    std::vector<double> I(size_t(D * D), 0.0);
    for (int64_t d = 0; d < D; ++d) I[size_t(d * D + d)] = 1.0;
    for (int64_t c = 0; c < D; ++c) {
        int64_t p = c;
        for (int64_t r = c + 1; r < D; ++r)
            if (std::fabs(A[size_t(r * D + c)]) > std::fabs(A[size_t(p * D + c)])) p = r;
        for (int64_t k = 0; k < D; ++k) std::swap(A[size_t(c * D + k)], A[size_t(p * D + k)]), std::swap(I[size_t(c * D + k)], I[size_t(p * D + k)]);
        const double piv = A[size_t(c * D + c)];
        for (int64_t k = 0; k < D; ++k) A[size_t(c * D + k)] /= piv, I[size_t(c * D + k)] /= piv;
        for (int64_t r = 0; r < D; ++r)
            if (r != c) {
                const double f = A[size_t(r * D + c)];
                for (int64_t k = 0; k < D; ++k) A[size_t(r * D + k)] -= f * A[size_t(c * D + k)], I[size_t(r * D + k)] -= f * I[size_t(c * D + k)];
            }
    }
    return I;
}

// V: m values of D at row stride ld = D + 5 (the slots are rows with other data between them),
// weights from cap's range (exp(tau cos - max) + eps) and a few 0 (the sinks: no term in A).
void check(int64_t m, int64_t D, uint32_t seed) {
    const int64_t ld = D + 5;
    std::mt19937 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::uniform_real_distribution<double> u(-10.0, 0.0);
    std::vector<double> V(size_t(m * ld), NAN), c(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
        c[size_t(i)] = i % 7 == 3 ? 0.0 : std::exp(u(rng)) + 1e-6;
        for (int64_t d = 0; d < D; ++d) V[size_t(i * ld + d)] = nd(rng);
    }
    std::vector<double> A(size_t(D * D), 0.0);
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e) {
            double s = d == e ? 1.0 : 0.0;
            for (int64_t i = 0; i < m; ++i) s += c[size_t(i)] * V[size_t(i * ld + d)] * V[size_t(i * ld + e)];
            A[size_t(d * D + e)] = s;
        }
    const std::vector<double> Ai = inverse(A, D);
    std::vector<double> ref(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
        double q = 0;
        for (int64_t d = 0; d < D; ++d)
            for (int64_t e = 0; e < D; ++e) q += V[size_t(i * ld + d)] * Ai[size_t(d * D + e)] * V[size_t(i * ld + e)];
        ref[size_t(i)] = q;
    }
    std::vector<double> scratch(size_t(cap_leverage_scratch_size(D)));
    for (int level : {0, 2, 3, 4}) {
        std::vector<double> l(static_cast<size_t>(m), -1.0);
        cap_leverages_at(level, m, D, V.data(), ld, c.data(), l.data(), scratch.data());
        for (int64_t i = 0; i < m; ++i)
            ASSERT_NEAR(l[size_t(i)], ref[size_t(i)], 1e-9 * std::max(1.0, ref[size_t(i)])) << "level " << level << " m " << m << " D " << D << " slot " << i;
    }
}

TEST(CapMath, LeveragesEqualTheExplicitInverseAtEveryLevel) {
    check(150, 64, 1);  // three blocks of the capacity sums (64, 64, 22), slot tiles and a leftover
    check(33, 16, 2);   // one column block of 16
    check(5, 8, 3);     // fewer slots than the head size; D 8 fits only the narrower tiles
    check(40, 12, 4);   // a head size no tile fits: the plain loops at every level
    check(0, 16, 5);    // no slot: nothing written
}

TEST(CapMath, KeyDotsAndNormsEqualTheF64SumsAtEveryLevel) {
    const int64_t R = 3, m = 45, ld = 128;
    for (int64_t D : {64, 12}) {
        std::mt19937 rng(uint32_t(9 + D));
        std::normal_distribution<double> nd(0.0, 1.0);
        std::vector<double> MU(size_t(R * D));
        std::vector<float> K(size_t(m * ld));
        for (double& x : MU) x = nd(rng);
        for (float& x : K) x = float(nd(rng));
        for (int level : {0, 2, 3, 4}) {
            std::vector<double> dots(size_t(R * m), NAN), kn(size_t(m), NAN);
            cap_key_dots_at(level, R, m, D, K.data(), ld, MU.data(), dots.data(), kn.data());
            for (int64_t i = 0; i < m; ++i) {
                double n = 0;
                for (int64_t d = 0; d < D; ++d) n += double(K[size_t(i * ld + d)]) * double(K[size_t(i * ld + d)]);
                ASSERT_NEAR(kn[size_t(i)], n, 1e-13 * n) << "level " << level << " key " << i;
                for (int64_t h = 0; h < R; ++h) {
                    double t = 0, mag = 0;
                    for (int64_t d = 0; d < D; ++d) t += MU[size_t(h * D + d)] * double(K[size_t(i * ld + d)]), mag += std::fabs(MU[size_t(h * D + d)] * double(K[size_t(i * ld + d)]));
                    ASSERT_NEAR(dots[size_t(h * m + i)], t, 1e-14 * mag) << "level " << level << " anchor " << h << " key " << i;
                }
            }
        }
    }
}

}  // namespace
}  // namespace kv::test
