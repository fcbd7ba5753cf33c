// The L1 norms of values seen through a slice of the output projection, ||W v_i||_1 for many v_i
// at once (critical-*'s n_j, kvpress' vwl1norm): the product W V is never stored, each tile of
// it goes to its columns' sums as it is made. The product's sums use fused multiply-adds where
// the CPU has them (AVX2, AVX-512), so the last bits depend on the ISA as the model's own
// products do; the sums over W's rows run in double.
#pragma once

#include <cstdint>

namespace kv {

// acc[i] += sum over c < E of |sum over d < D of W[c * ldw + d] * Vt[d * ldv + i]|, for i < m.
void projected_l1_norms(int64_t E, int64_t m, int64_t D, const float* W, int64_t ldw, const float* Vt, int64_t ldv, double* acc);

}  // namespace kv
