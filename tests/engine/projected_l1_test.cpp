// projected_l1_norms (engine/kv/policies/projected_l1.h), critical-*'s ||W_o,h v||_1, against
// naive f64 sums on shapes that hit the row and column tiles and their tails, strided operands,
// and accumulation into sums already there. The f32 product's error is bounded by D u times
// sum_d |w v| per output row (any order, fused or not).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/kv/policies/projected_l1.h"

namespace kv::test {
namespace {

void check(int64_t E, int64_t m, int64_t D) {
    const int64_t ldw = D + 7, ldv = m + 3;
    std::mt19937 rng(uint32_t(E * 1000 + m * 10 + D));
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> W(size_t(E * ldw)), Vt(size_t(D * ldv));
    for (float& x : W) x = g(rng);
    for (float& x : Vt) x = g(rng);
    std::vector<double> acc(static_cast<size_t>(m)), start(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) acc[size_t(i)] = start[size_t(i)] = 0.25 * double(i);
    projected_l1_norms(E, m, D, W.data(), ldw, Vt.data(), ldv, acc.data());
    for (int64_t i = 0; i < m; ++i) {
        double want = start[size_t(i)], bound = 0;
        for (int64_t c = 0; c < E; ++c) {
            double x = 0, mag = 0;
            for (int64_t d = 0; d < D; ++d) {
                const double p = double(W[size_t(c * ldw + d)]) * double(Vt[size_t(d * ldv + i)]);
                x += p, mag += std::fabs(p);
            }
            want += std::fabs(x);
            bound += (double(D) + 2) * std::ldexp(1.0, -24) * mag + 8 * std::ldexp(1.0, -24) * std::fabs(x);
        }
        ASSERT_NEAR(acc[size_t(i)], want, bound + 1e-12) << "column " << i << " of E " << E << ", m " << m << ", D " << D;
    }
}

TEST(ProjectedL1, EqualsTheF64SumsOnEveryTileAndTail) {
    for (int64_t E : {1, 8, 13, 64, 67})
        for (int64_t m : {1, 16, 32, 37, 64})
            for (int64_t D : {1, 5, 64}) {
                check(E, m, D);
                if (::testing::Test::HasFatalFailure()) return;
            }
}

}  // namespace
}  // namespace kv::test
