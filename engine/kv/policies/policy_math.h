// Dense products for policies that score with matrices (rkv's key similarities, expected
// attention's quadratic forms and query moments). The engine is built for x86-64-v2; this
// product is compiled once more for x86-64-v3 and -v4 (GCC target attributes, chosen once by
// the CPU), so it runs at the CPU's vector width without the kernel-variant plumbing. Every
// level sums over k in the same order, one product per output: results are identical.
#pragma once

#include <cstdint>

namespace kv {

// C (m x n, row stride ldc) = A (m x k, row stride lda) . B (k x n, row stride ldb); with
// accumulate, C += A . B.
void policy_matmul(int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                   bool accumulate = false);
void policy_matmul(int64_t m, int64_t n, int64_t k, const double* A, int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc,
                   bool accumulate = false);

// The same product at ISA level `level` or the best below it this CPU runs (2 = baseline,
// 3 = AVX2, 4 = AVX-512), and the level policy_matmul uses; for tests of every path.
void policy_matmul_at(int level, int64_t m, int64_t n, int64_t k, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                      int64_t ldc, bool accumulate);
void policy_matmul_at(int level, int64_t m, int64_t n, int64_t k, const double* A, int64_t lda, const double* B, int64_t ldb, double* C,
                      int64_t ldc, bool accumulate);
int policy_matmul_level();

// y[i] = exp(x[i]) for x <= 709 (about 1 ulp from std::exp; 0 below -708, where std::exp is
// subnormal), returning sum_i y[i] added in 8 interleaved partial sums (element i to sum i % 8,
// each in order, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))): the same polynomial and
// the same sums at every ISA level, so results are identical on every CPU. For softmaxes over
// many scores (cake's), where std::exp one value at a time dominated.
double policy_exp_sum(const double* x, double* y, int64_t n);
double policy_exp_sum_at(int level, const double* x, double* y, int64_t n);

// policy_exp_sum in f32 exponentials, where the scores' tolerance allows them (finch's window
// softmaxes): e^x by expf_core (Cody-Waite, Taylor to r^7: within 2
// ulp of float of std::exp for -87 <= x <= 0; 0 below -87), its argument float(x) (a shifted
// logit: rounding it moves e^x by at most |x| 2^-24 relative, so a weight that counts is as
// exact as one that does not), summed in f64 as policy_exp_sum sums: identical on every CPU.
// policy_exp_sum_f32: y[i] = double(exp_f32(float(x[i]))), returns their sum.
double policy_exp_sum_f32(const double* x, double* y, int64_t n);
double policy_exp_sum_f32_at(int level, const double* x, double* y, int64_t n);

}  // namespace kv
