// Fused multiply-add products and the tile softmax for the query-agnostic scorers
// (non-causal-attn, leverage, compactor), whose per-chunk products dominate their cost. Where the
// CPU has FMA (ISA levels 3 and 4, x86-64-v3 / -v4 target attributes, chosen once by the CPU as
// policy_matmul's), every multiply-add is fused: half the instructions of policy_matmul's unfused
// ones, and one rounding instead of two. The baseline level (no FMA) multiplies and adds. Each
// output is one chain over k in order whatever the register tile, so levels 3 and 4 give the
// same bits, and level 2 the bits of the unfused loop.
#pragma once

#include <cstdint>

namespace kv {

// C (m x n, row stride ldc) = A . B, or with accumulate C += A . B, where A(i, d) =
// A[i * sar + d * sad] (a row-major A: sar = lda, sad = 1; the transpose of a row-major X of row
// stride ldx: sar = 1, sad = ldx) and B is row-major (k x n, row stride ldb). C[i][j] is
// s = fma(A(i, d), B[d][j], s) for d = 0 .. k - 1 from s = 0 (level 2: s += A(i, d) B[d][j]),
// then added to the old C[i][j] when accumulating.
void policy_matmul_fma(int64_t m, int64_t n, int64_t k, const float* A, int64_t sar, int64_t sad, const float* B, int64_t ldb, float* C,
                       int64_t ldc, bool accumulate = false);
void policy_matmul_fma(int64_t m, int64_t n, int64_t k, const double* A, int64_t sar, int64_t sad, const double* B, int64_t ldb, double* C,
                       int64_t ldc, bool accumulate = false);
void policy_matmul_fma_at(int level, int64_t m, int64_t n, int64_t k, const float* A, int64_t sar, int64_t sad, const float* B, int64_t ldb,
                          float* C, int64_t ldc, bool accumulate);
void policy_matmul_fma_at(int level, int64_t m, int64_t n, int64_t k, const double* A, int64_t sar, int64_t sad, const double* B,
                          int64_t ldb, double* C, int64_t ldc, bool accumulate);

// The column sums of a tile's row softmaxes (non-causal-attn's A): for each row i < m of S
// (m x n, row stride lds) with use[i] != 0, e_ij = exp(S_ij - max_j S_ij) in f32 (in place: S is
// overwritten), z_i = sum_j e_ij (f32 lanes over 8 vectors at a time, those partial sums added
// in f64), w_i = float(1 / (z_i R)); then
//   A[j] += sum over the used rows i of w_i e_ij
// with the f32 products summed in f32 over blocks of 8 rows and the blocks added in f64 (relative
// error < 1e-6, the exponentials' within 2 ulp of float: see docs/POLICIES.md#non-causal-attn).
// w: scratch of m floats.
void policy_tile_softmax_colsum(float* S, int64_t m, int64_t n, int64_t lds, const uint8_t* use, double R, double* A, float* w);
void policy_tile_softmax_colsum_at(int level, float* S, int64_t m, int64_t n, int64_t lds, const uint8_t* use, double R, double* A,
                                   float* w);

// Both for one head of a tile: A[j] += the column sums of the row softmaxes of Q . Kt (Q: m x D,
// row stride ldq; Kt: D x n, row stride ldk), in strips of 8 queries whose logits stay in the L1
// cache: the bits of policy_matmul_fma into an m x n S, then policy_tile_softmax_colsum, at the
// same level. S: scratch of 8 n floats, acc: of n doubles.
void policy_tile_attention_colsum(const float* Q, int64_t ldq, const float* Kt, int64_t ldk, int64_t m, int64_t n, int64_t D, const uint8_t* use,
                                  double R, double* A, float* S, double* acc);
void policy_tile_attention_colsum_at(int level, const float* Q, int64_t ldq, const float* Kt, int64_t ldk, int64_t m, int64_t n, int64_t D,
                                     const uint8_t* use, double R, double* A, float* S, double* acc);

}  // namespace kv
