// Small tensor helpers shared by the reverse passes: matrix products of (..., K) activations
// with (K, N) weights (the weight is lifted to the activation's rank, batch dims broadcast),
// and (..., C) -> (rows, C) views.
#pragma once

#include "engine/core/tensor.h"
#include "engine/ops/ops.h"

namespace kv::grad {

// w with leading size-1 dims until it has `rank` dims (a view).
inline Tensor lift(const Tensor& w, int rank) {
    Tensor t = w;
    while (t.ndim() < rank) t = t.unsqueeze(0);
    return t;
}

// a (..., K) @ w (K, N) -> (..., N)
inline Tensor mm(const Tensor& a, const Tensor& w, DType out) {
    return ops::matmul(a, lift(w, a.ndim()), out);
}

// out (..., N) = alpha a (..., K) @ w (K, N) + beta out
inline void mm_(Tensor& out, const Tensor& a, const Tensor& w, float alpha, float beta) {
    ops::matmul_(out, a, lift(w, a.ndim()), alpha, beta);
}

// (..., C) -> (rows, C), contiguous (a copy when the input is not).
inline Tensor rows2d(const Tensor& t) {
    Tensor c = t.contiguous();
    return c.reshape({c.numel() / c.size(c.ndim() - 1), c.size(c.ndim() - 1)});
}

}  // namespace kv::grad
