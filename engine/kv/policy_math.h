// Dense products for policies that score with matrices (rkv's key similarities, expected
// attention's quadratic forms and query moments). The engine is built for x86-64-v2; these
// few loops are compiled once more for x86-64-v3 and -v4 (GCC target_clones, chosen at load
// time by the CPU), so they run at the vector width the CPU has without the kernel-variant
// plumbing. Plain loops: results do not depend on the clone beyond f32/f64 rounding order.
#pragma once

#include <cstdint>

namespace kv {

// C (m x n, row stride ldc) = A (m x k, row stride lda) . B (k x n, row stride ldb); with
// accumulate, C += A . B.
void policy_matmul(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                   bool accumulate = false);
void policy_matmul(int64_t m, int64_t n, int64_t k, const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc,
                   bool accumulate = false);

}  // namespace kv
