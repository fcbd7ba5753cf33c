// Dense products for matrix-scoring policies (see policy_math.h).
#include "policy_math.h"

namespace kv {

namespace {

// Four rows of C at a time, so every row of B loaded feeds four rows; the innermost loop runs
// along C's row (no reduction), which the compiler vectorises at the clone's width.
template <class F>
__attribute__((always_inline)) inline void matmul_body(int64_t m, int64_t n, int64_t k, const F* __restrict A, int64_t lda,
                                                       const F* __restrict B, int64_t ldb, F* __restrict C, int64_t ldc, bool acc) {
    if (!acc)
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = F(0);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        F* __restrict c0 = C + i * ldc;
        F* __restrict c1 = c0 + ldc;
        F* __restrict c2 = c1 + ldc;
        F* __restrict c3 = c2 + ldc;
        for (int64_t d = 0; d < k; ++d) {
            const F a0 = A[i * lda + d], a1 = A[(i + 1) * lda + d], a2 = A[(i + 2) * lda + d], a3 = A[(i + 3) * lda + d];
            const F* __restrict b = B + d * ldb;
            for (int64_t j = 0; j < n; ++j) {
                const F bj = b[j];
                c0[j] += a0 * bj;
                c1[j] += a1 * bj;
                c2[j] += a2 * bj;
                c3[j] += a3 * bj;
            }
        }
    }
    for (; i < m; ++i) {
        F* __restrict c = C + i * ldc;
        for (int64_t d = 0; d < k; ++d) {
            const F a = A[i * lda + d];
            const F* __restrict b = B + d * ldb;
            for (int64_t j = 0; j < n; ++j) c[j] += a * b[j];
        }
    }
}

}  // namespace

#if defined(__x86_64__) && !defined(KVLAB_NO_TARGET_CLONES)
#define KV_POLICY_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KV_POLICY_CLONES
#endif

KV_POLICY_CLONES void policy_matmul(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                                    int64_t ldc, bool accumulate) {
    matmul_body(m, n, k, A, lda, B, ldb, C, ldc, accumulate);
}

KV_POLICY_CLONES void policy_matmul(int64_t m, int64_t n, int64_t k, const double* A, int64_t lda, const double* B, int64_t ldb, double* C,
                                    int64_t ldc, bool accumulate) {
    matmul_body(m, n, k, A, lda, B, ldb, C, ldc, accumulate);
}

}  // namespace kv
