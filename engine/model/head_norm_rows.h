// Per-head RMSNorm of a fused q/k/v projection for f32 activations (Gemma 3n's q_norm, k_norm
// and v_norm, applied head by head), in one pass over each token's row: the rows of one head are
// HS channels, too short for the row kernels' per-row addressing to pay off. Each body compiled
// per ISA level (host_simd.h); tokens in parallel.
#pragma once

#include <cstdint>

namespace kv::head_norm_rows {

// qkv (rows, W) with W = heads * hs: head h of every row normalised with weight w + h * hs
// (per-head weights (heads, hs), already offset) into out (rows, W), in f32 as ops::rmsnorm
// computes it: y = x rsqrt(mean(x^2) + eps) w.
void normalise(const float* qkv, int64_t rows, int64_t heads, int64_t hs, const float* w, float eps, float* out);

}  // namespace kv::head_norm_rows
