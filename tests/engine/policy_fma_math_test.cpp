// policy_matmul_fma, policy_tile_softmax_colsum and policy_tile_attention_colsum
// (engine/kv/policies/policy_fma_math.h), the
// products and the tile softmax of non-causal-attn, leverage and compactor: every ISA path this
// CPU runs against f64 references (the products also against the exact chain of fused or unfused
// multiply-adds each output is documented to be), on shapes that hit the register tiles, the row
// and column tails, strided and transposed operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_fma_math.h"
#include "engine/kv/policies/policy_math.h"

namespace kv::test {
namespace {

template <class F>
void check_product(int level, int64_t m, int64_t n, int64_t k, bool transposed, bool acc) {
    // A(i, d) at A[i * sar + d * sad]: row-major with a padded stride, or read transposed from a
    // row-major (k x lda) matrix
    const int64_t lda = (transposed ? m : k) + 3, ldb = n + 5, ldc = n + 2;
    const int64_t sar = transposed ? 1 : lda, sad = transposed ? lda : 1;
    std::mt19937 rng(uint32_t(1000 * m + 10 * n + k + (transposed ? 7 : 0)));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<F> A(size_t((transposed ? k : m) * lda)), B(size_t(k * ldb)), C(size_t(m * ldc));
    for (F& x : A) x = F(u(rng));
    for (F& x : B) x = F(u(rng));
    for (F& x : C) x = F(u(rng));
    const std::vector<F> C0 = C;
    policy_matmul_fma_at(level, m, n, k, A.data(), sar, sad, B.data(), ldb, C.data(), ldc, acc);
    const bool fused = std::min(level, policy_matmul_level()) >= 3;
    const double eps = sizeof(F) == 4 ? 6e-8 : 1.2e-16;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
            const size_t at = size_t(i * ldc + j);
            if (j >= n) {  // padding past the row: never written
                ASSERT_EQ(C[at], C0[at]) << "wrote past row " << i << " at column " << j;
                continue;
            }
            double ref = acc ? double(C0[at]) : 0.0, mag = std::fabs(ref);
            F chain = 0;
            for (int64_t d = 0; d < k; ++d) {
                const F a = A[size_t(i * sar + d * sad)], b = B[size_t(d * ldb + j)];
                ref += double(a) * double(b), mag += std::fabs(double(a) * double(b));
                chain = fused ? std::fma(a, b, chain) : F(chain + F(a * b));
            }
            const F want = (acc ? C0[at] : F(0)) + chain;
            ASSERT_EQ(C[at], want) << "level " << level << " shape " << m << "x" << n << "x" << k << " at (" << i << ", " << j << ")";
            ASSERT_NEAR(double(C[at]), ref, 2.0 * double(k + 2) * eps * mag + 1e-30) << "level " << level;
        }
}

TEST(PolicyMatmulFma, EveryIsaPathIsItsMultiplyAddChainAndNearTheF64Reference) {
    for (int level = 2; level <= policy_matmul_level(); ++level)
        for (bool transposed : {false, true})
            for (bool acc : {false, true})
                for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {8, 32, 64}, {17, 41, 9}, {3, 16, 48}, {24, 48, 61}, {9, 7, 0}}) {
                    check_product<float>(level, m, n, k, transposed, acc);
                    check_product<double>(level, m, n, k, transposed, acc);
                }
}

// A_j += sum_{i used} softmax_j(S_i) / R in f64 from the original scores.
std::vector<double> softmax_colsum_reference(const std::vector<float>& S, int64_t m, int64_t n, int64_t lds, const std::vector<uint8_t>& use,
                                             double R, std::vector<double> A) {
    for (int64_t i = 0; i < m; ++i) {
        if (!use[size_t(i)]) continue;
        double mx = -INFINITY, z = 0;
        for (int64_t j = 0; j < n; ++j) mx = std::max(mx, double(S[size_t(i * lds + j)]));
        for (int64_t j = 0; j < n; ++j) z += std::exp(double(S[size_t(i * lds + j)]) - mx);
        for (int64_t j = 0; j < n; ++j) A[size_t(j)] += std::exp(double(S[size_t(i * lds + j)]) - mx) / (z * R);
    }
    return A;
}

TEST(PolicyTileSoftmax, EveryIsaPathEqualsTheF64ReferenceAndSkipsRowsWithoutQueries) {
    for (int level = 2; level <= policy_matmul_level(); ++level)
        for (auto [m, n] : std::vector<std::array<int64_t, 2>>{{1, 1}, {5, 5}, {37, 37}, {64, 64}, {256, 256}, {19, 83}}) {
            const int64_t lds = n + 3;
            std::mt19937 rng(uint32_t(100 * m + n));
            // logits of an unscaled attention: spreads of tens, as non-causal-attn's dot products
            std::normal_distribution<double> g(0.0, 12.0);
            std::vector<float> S(size_t(m * lds));
            for (float& x : S) x = float(g(rng));
            std::vector<uint8_t> use((size_t)m, 1);
            for (int64_t i = 0; i < m; i += 4) use[size_t(i)] = 0;  // rows without a query
            std::vector<double> A((size_t)n);
            for (double& a : A) a = std::fabs(g(rng));
            const std::vector<double> ref = softmax_colsum_reference(S, m, n, lds, use, 3.0, A);
            const std::vector<float> S0 = S;
            std::vector<float> w((size_t)m);
            policy_tile_softmax_colsum_at(level, S.data(), m, n, lds, use.data(), 3.0, A.data(), w.data());
            for (int64_t j = 0; j < n; ++j)
                ASSERT_NEAR(A[size_t(j)], ref[size_t(j)], 2e-6 * std::fabs(ref[size_t(j)]) + 1e-300)
                    << "level " << level << " shape " << m << "x" << n << " column " << j;
            for (int64_t i = 0; i < m; ++i)
                for (int64_t j = 0; j < lds; ++j) {
                    if (use[size_t(i)] && j < n) continue;
                    ASSERT_EQ(S[size_t(i * lds + j)], S0[size_t(i * lds + j)]) << "wrote a row without a query or past a row";
                }
        }
}

TEST(PolicyTileAttention, StripsOfEightQueriesGiveTheBitsOfTheWholeProductThenTheSoftmax) {
    for (int level = 2; level <= policy_matmul_level(); ++level)
        for (auto [m, n, D] : std::vector<std::array<int64_t, 3>>{{1, 1, 3}, {5, 5, 16}, {37, 37, 32}, {256, 256, 32}, {19, 83, 8}}) {
            const int64_t ldq = D + 2, ldk = n + 3;
            std::mt19937 rng(uint32_t(100 * m + n + D));
            std::normal_distribution<double> g(0.0, 2.0);
            std::vector<float> Q((size_t)(m * ldq)), Kt((size_t)(D * ldk));
            for (float& x : Q) x = float(g(rng));
            for (float& x : Kt) x = float(g(rng));
            std::vector<uint8_t> use((size_t)m, 1);
            for (int64_t i = 1; i < m; i += 5) use[size_t(i)] = 0;
            std::vector<double> A((size_t)n, 0.25), A2 = A, acc((size_t)n);
            std::vector<float> S((size_t)(m * n)), strip((size_t)(8 * n)), w((size_t)m);
            policy_matmul_fma_at(level, m, n, D, Q.data(), ldq, 1, Kt.data(), ldk, S.data(), n, false);
            policy_tile_softmax_colsum_at(level, S.data(), m, n, n, use.data(), 4.0, A.data(), w.data());
            policy_tile_attention_colsum_at(level, Q.data(), ldq, Kt.data(), ldk, m, n, D, use.data(), 4.0, A2.data(), strip.data(), acc.data());
            for (int64_t j = 0; j < n; ++j) ASSERT_EQ(A2[size_t(j)], A[size_t(j)]) << "level " << level << " shape " << m << "x" << n << " column " << j;
        }
}

}  // namespace
}  // namespace kv::test
