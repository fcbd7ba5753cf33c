// cake's per-row window math (policy_cake.cpp), compiled for each ISA level: the loops run
// across slots, elementwise, so every level gives the same bits.
#pragma once

#include <cstdint>

namespace kv {

// The window's softmax: row m of `logits` (rows x T, query m % q of the window at position
// q0 + m % q) over the slots that query sees (0 <= pos[j] <= its position), scaled by `scale`,
// into row m of `a` (rows x T, f64; unseen slots 0). xs: scratch of T.
void cake_window_softmax(int level, const float* logits, int64_t rows, int64_t q, int64_t T, const int32_t* pos, int64_t q0, float scale,
                         double* xs, double* a);

// The indicator's moments over the window's q queries for each of R heads of `a` ((R q) x T):
// u[j] = sum over heads of (mean_i a + gamma var_i a) / R (unbiased variance; 0 for one query),
// each sum over i and over heads in order. With `preference`, H and V gain the entropy and
// variance of the slots before the window (pos[j] < q0). s1, s2, mean: scratch of T.
void cake_window_moments(int level, const double* a, int64_t R, int64_t q, int64_t T, const int32_t* pos, int64_t q0, double gamma,
                         bool preference, double* s1, double* s2, double* mean, double* u, double& H, double& V);

}  // namespace kv
