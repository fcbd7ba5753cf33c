// The per-key terms of expected-attention's exponent (policy_expected_attention.cpp), for all of
// a KV head's cached keys and its query heads at once:
//   lin(h, j)  = k_j . mu'_h                       (f64 mean, f32 key)
//   quad(h, j) = k_j^T Sigma'_h k_j                 (Sigma'_h symmetric, given by its upper triangle)
// The quadratic form uses the symmetry: with U_h = Sigma'_h's upper triangle with its diagonal
// halved (zeros below), k^T Sigma' k = 2 k^T (U k) needs only the d <= e half of the products of
// a full K . Sigma'. Compiled for x86-64-v4, -v3 and the baseline like policy_matmul
// (policy_math.h), with sums in one fixed order at every level, so results do not depend on the CPU.
#pragma once

#include <cstdint>

namespace kv {

// K: T keys (row stride ldk) of D floats. U: D rows (stride ldu) holding R heads' upper triangles
// side by side (head h in columns [h D, h D + D)); entries below each diagonal must be 0.
// M: R means of D doubles. Writes lin[h T + j] and, when quad is not null, quad[h T + j].
// Order of the sums (every level): t_e = sum_{d=0..e} K[j,d] U[d,e] in f32, d ascending (mul, then
// add); then per term x_e (K[j,e] t_e, resp. K[j,e] M[e], exact in f64) 8 f64 lanes, lane e mod 8
// summed with e ascending, reduced as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); quad = 2 * that sum.
void ea_key_forms(int64_t T, int64_t D, int64_t R, const float* K, int64_t ldk, const float* U, int64_t ldu, const double* M, double* lin,
                  double* quad);
// The same at ISA level `level` (2 = baseline, 3 = AVX2, 4 = AVX-512) or the best below it this
// CPU runs; level 0 = the plain scalar loops (the fallback when D is not a multiple of the
// vector width). For tests of every path.
void ea_key_forms_at(int level, int64_t T, int64_t D, int64_t R, const float* K, int64_t ldk, const float* U, int64_t ldu,
                     const double* M, double* lin, double* quad);

// The query second moments: S2 (D x D, row stride D) += X^T X for X the m x D rows of queries,
// on the upper triangle (e >= d; entries below it may be written too, never read). Each entry
// is one sum over the rows in order (mul, then add) added to S2: bit for bit what the full
// product policy_matmul(D, D, m, X^T, m, X, D, S2, D, true) gives there, at every level.
void ea_moments_upper(int64_t m, int64_t D, const double* X, double* S2);
void ea_moments_upper_at(int level, int64_t m, int64_t D, const double* X, double* S2);

}  // namespace kv
