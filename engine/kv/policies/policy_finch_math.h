// finch's logits and window softmaxes over one row's slots (policy_finch.cpp), compiled for each
// ISA level. The softmax loops run across slots, elementwise, so every level gives the same bits;
// the logits' sums use fused multiply-adds where the CPU has them (AVX2, AVX-512), so their last
// bits depend on the ISA as the model's own products do (f64: far inside the scores' tolerance).
#pragma once

#include <cstdint>

namespace kv {

// C (M x T, row stride T) = scale (Q (M x D, row stride D) . Kt (D x T, row stride ldk)), in f64
// (Kt's floats exactly; each sum over D, then times scale).
void finch_logits(int64_t M, int64_t T, int64_t D, const double* Q, const float* Kt, int64_t ldk, double scale, double* C);
// The same at ISA level `level` (2 = baseline, 3 = AVX2, 4 = AVX-512) or the best below it this
// CPU runs; for tests of every path.
void finch_logits_at(int level, int64_t M, int64_t T, int64_t D, const double* Q, const float* Kt, int64_t ldk, double scale, double* C);

// For each of the M rows m of `logit` (M x T, f64, the scaled logits, overwritten: masked in
// place; window query m % nq at position first + m % nq): the softmax over the slots it sees (the slots in `late`, n_late of them, are
// the only ones it may not: 0 <= pos[j] <= its position), exponentials by policy_exp_sum_f32,
// and acc[j] += e_j (p or 1) / (z M) pre[j] (pre: 1 for a scored slot, else 0). e: scratch of T.
void finch_window_scores(int level, double* logit, int64_t M, int64_t nq, int64_t T, const int32_t* pos, int64_t first,
                         const int64_t* late, int64_t n_late, bool normalize, const double* pre, double* e, double* acc);

}  // namespace kv
