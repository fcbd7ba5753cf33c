// finch's window softmaxes over one row's slots (policy_finch.cpp), compiled for each ISA level:
// the loops run across slots, elementwise, so every level gives the same bits.
#pragma once

#include <cstdint>

namespace kv {

// For each of the M rows m of `logit` (M x T, f64; window query m % nq at position
// first + m % nq): the softmax over the slots it sees (the slots in `late`, n_late of them, are
// the only ones it may not: 0 <= pos[j] <= its position), exponentials by policy_exp_sum_f32,
// and acc[j] += e_j (p or 1) / (z M) pre[j] (pre: 1 for a scored slot, else 0). x, e: scratch of T.
void finch_window_scores(int level, const double* logit, int64_t M, int64_t nq, int64_t T, const int32_t* pos, int64_t first,
                         const int64_t* late, int64_t n_late, double scale, bool normalize, const double* pre, double* x, double* e,
                         double* acc);

}  // namespace kv
