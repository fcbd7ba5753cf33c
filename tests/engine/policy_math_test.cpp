// policy_matmul (engine/kv/policies/policy_math.h), the product under rkv's similarities and expected
// attention's quadratic forms: every ISA path this CPU runs against an f64 reference, on
// shapes that hit the register tiles, the row and column tails and strided operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_math.h"

namespace kv::test {
namespace {

template <class F>
void check_level(int level, int64_t m, int64_t n, int64_t k, bool acc) {
    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 2;  // strides wider than the rows
    std::mt19937 rng(uint32_t(1000 * m + 10 * n + k));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<F> A(size_t(m * lda)), B(size_t(k * ldb)), C(size_t(m * ldc));
    for (F& x : A) x = F(u(rng));
    for (F& x : B) x = F(u(rng));
    for (F& x : C) x = F(u(rng));
    const std::vector<F> C0 = C;
    policy_matmul_at(level, m, n, k, A.data(), lda, B.data(), ldb, C.data(), ldc, acc);
    const double eps = sizeof(F) == 4 ? 6e-8 : 1.2e-16;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
            const size_t at = size_t(i * ldc + j);
            if (j >= n) {  // padding past the row: never written
                ASSERT_EQ(C[at], C0[at]) << "wrote past row " << i << " at column " << j;
                continue;
            }
            double ref = acc ? double(C0[at]) : 0.0, mag = std::fabs(ref);
            for (int64_t d = 0; d < k; ++d) {
                const double p = double(A[size_t(i * lda + d)]) * double(B[size_t(d * ldb + j)]);
                ref += p, mag += std::fabs(p);
            }
            ASSERT_NEAR(double(C[at]), ref, 2.0 * double(k + 2) * eps * mag + 1e-30)
                << "level " << level << " shape " << m << "x" << n << "x" << k << " at (" << i << ", " << j << ")";
        }
}

template <class F>
std::vector<F> product_at(int level, int64_t m, int64_t n, int64_t k) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<F> A(size_t(m * k)), B(size_t(k * n)), C(size_t(m * n), F(0));
    for (F& x : A) x = F(u(rng));
    for (F& x : B) x = F(u(rng));
    policy_matmul_at(level, m, n, k, A.data(), k, B.data(), n, C.data(), n, false);
    return C;
}

TEST(PolicyMatmul, EveryIsaPathEqualsTheF64ReferenceOnTilesAndTails) {
    const int top = policy_matmul_level();
    ASSERT_GE(top, 2);
    for (int level = 2; level <= top; ++level)
        for (bool acc : {false, true})
            for (auto [m, n, k] : {std::array<int64_t, 3>{1, 1, 1}, {4, 32, 3}, {13, 45, 7}, {32, 256, 64}, {9, 67, 16}}) {
                check_level<float>(level, m, n, k, acc);
                check_level<double>(level, m, n, k, acc);
            }
}

TEST(PolicyMatmul, EveryIsaPathGivesBitIdenticalProducts) {
    // each output is one sum over k in index order at every level: no result may depend on the CPU
    const auto f2 = product_at<float>(2, 21, 75, 19);
    const auto d2 = product_at<double>(2, 21, 75, 19);
    for (int level = 3; level <= policy_matmul_level(); ++level) {
        EXPECT_EQ(product_at<float>(level, 21, 75, 19), f2) << "level " << level;
        EXPECT_EQ(product_at<double>(level, 21, 75, 19), d2) << "level " << level;
    }
}

TEST(PolicyExpSum, EveryIsaPathIsWithinTwoUlpsOfStdExpAndSumsInItsDocumentedOrder) {
    // std::exp is the reference (correctly rounded within 1 ulp in glibc); the sum is the
    // documented grouping of 8 interleaved partial sums, written out here
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> u(-60.0, 5.0);
    for (int64_t n : {1, 7, 8, 13, 64, 255}) {
        std::vector<double> x((size_t)n), y((size_t)n);
        for (double& v : x) v = u(rng);
        x[0] = 0.0;
        if (n > 3) x[1] = -707.5, x[2] = -720.0, x[3] = 700.0;  // near the normal range's ends
        for (int level = 2; level <= policy_matmul_level(); ++level) {
            const double sum = policy_exp_sum_at(level, x.data(), y.data(), n);
            double s[8] = {};
            for (int64_t i = 0; i < n; ++i) {
                const double want = x[size_t(i)] < -708.0 ? 0.0 : std::exp(x[size_t(i)]);
                EXPECT_LE(std::fabs(y[size_t(i)] - want), 4.5e-16 * want) << "x " << x[size_t(i)] << " level " << level;
                s[i % 8] += y[size_t(i)];
            }
            EXPECT_EQ(sum, ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) << "n " << n << " level " << level;
        }
    }
}

TEST(PolicyExpSum, EveryIsaPathGivesBitIdenticalValues) {
    std::vector<double> x(77), y2(77), y(77);
    for (size_t i = 0; i < x.size(); ++i) x[i] = -0.37 * double(i) + 0.01;
    const double s2 = policy_exp_sum_at(2, x.data(), y2.data(), 77);
    for (int level = 3; level <= policy_matmul_level(); ++level) {
        EXPECT_EQ(policy_exp_sum_at(level, x.data(), y.data(), 77), s2) << "level " << level;
        EXPECT_EQ(y, y2) << "level " << level;
    }
}

// The f32 exponentials against std::exp in f64 (expf_core: within 2 ulp of float, 0 below -87),
// summed in f64 in the documented grouping; every ISA path the same bits.
TEST(PolicyExpSumF32, EveryIsaPathIsWithinTwoFloatUlpsOfStdExpAndSumsInItsDocumentedOrder) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> u(-90.0, 0.0);
    for (int64_t n : {1, 7, 8, 13, 64, 255}) {
        std::vector<double> x((size_t)n), y((size_t)n), y2((size_t)n);
        for (double& v : x) v = u(rng);
        x[0] = 0.0;
        if (n > 3) x[1] = -86.9, x[2] = -87.5, x[3] = -1000.0;  // near the bottom of the normal range, a mask
        double s2 = 0;
        for (int level = 2; level <= policy_matmul_level(); ++level) {
            const double sum = policy_exp_sum_f32_at(level, x.data(), y.data(), n);
            double s[8] = {};
            for (int64_t i = 0; i < n; ++i) {
                const double xi = double(float(x[size_t(i)]));  // the argument is rounded to float first
                const double want = xi < -87.0 ? 0.0 : std::exp(xi);
                EXPECT_LE(std::fabs(y[size_t(i)] - want), 2.4e-7 * want) << "x " << x[size_t(i)] << " level " << level;
                // and the float rounding of the argument moves e^x by at most |x| 2^-24 relative
                if (x[size_t(i)] >= -80.0) {
                    EXPECT_LE(std::fabs(y[size_t(i)] - std::exp(x[size_t(i)])), (2.4e-7 + std::fabs(x[size_t(i)]) * 6e-8) * std::exp(x[size_t(i)]));
                }
                s[i % 8] += y[size_t(i)];
            }
            EXPECT_EQ(sum, ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) << "n " << n << " level " << level;
            if (level == 2) y2 = y, s2 = sum;
            EXPECT_EQ(y, y2) << "level " << level;
            EXPECT_EQ(sum, s2) << "level " << level;
        }
    }
}

}  // namespace
}  // namespace kv::test
