// cap's per-head math (policy_cap.cpp) in f64, compiled for x86-64-v4, -v3 and the baseline: the
// keys' alignments with the query anchors, and the weighted capacity matrix, its Cholesky factor
// and v^T A^-1 v of every value. The products use fused multiply-adds where the CPU has them
// (AVX2, AVX-512), so the last bits depend on the ISA as the model's own products do; every level
// is the same f64 math, far inside the scores' tolerance.
#pragma once

#include <cstdint>

namespace kv {

// The keys' alignments: for m keys K (row stride ldk) of D floats and Rp anchors MU (Rp x D),
//   dots[h m + i] = MU_h . k_i        kn[i] = |k_i|^2
void cap_key_dots(int64_t Rp, int64_t m, int64_t D, const float* K, int64_t ldk, const double* MU, double* dots, double* kn);
// The same at ISA level `level` (2 = baseline, 3 = AVX2, 4 = AVX-512) or the best below it this
// CPU runs; level 0 = the plain scalar loops. For tests of every path.
void cap_key_dots_at(int level, int64_t Rp, int64_t m, int64_t D, const float* K, int64_t ldk, const double* MU, double* dots, double* kn);

// Scratch of cap_leverages (cap_leverage_scratch_size(D) doubles), kept across calls.
int64_t cap_leverage_scratch_size(int64_t D);

// For m values V (row stride ldv) of D with weights c (m, >= 0; a slot of weight 0 adds nothing):
//   A    = I + sum_i c_i v_i v_i^T
//   l[i] = v_i^T A^-1 v_i            for i < m
void cap_leverages(int64_t m, int64_t D, const double* V, int64_t ldv, const double* c, double* l, double* scratch);
void cap_leverages_at(int level, int64_t m, int64_t D, const double* V, int64_t ldv, const double* c, double* l, double* scratch);

}  // namespace kv
