// Engine-level ops: validate shapes and dtypes (one clear error per misuse), allocate outputs
// from the tracked allocator, and dispatch one OpCall to the backend of the operands' device.
// Semantics of every op are in kernels/common/op.h. Functions ending in `_` write into an
// existing tensor; the others return a new one (category activations unless stated).
#pragma once

#include "engine/core/tensor.h"
#include "kernels/common/op.h"
#include "kernels/common/quant_formats.h"

namespace kv::ops {

// Run a fully built call on the backend of its destination's device (no validation).
void dispatch(OpCall& call);
// Context for calls made from this thread (threads, workspace allocator).
OpContext current_context();

// ---- linear algebra ---------------------------------------------------------------------
// out[..., M, N] = alpha * a[..., M, K] @ b[..., K, N] + beta * out. Batch dims broadcast;
// a and b may be any strided views (transposes included).
void matmul_(Tensor& out, const Tensor& a, const Tensor& b, float alpha = 1.0f, float beta = 0.0f);
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype = DType::F32);
// y[..., N] = x[..., K] @ w[N, K]^T  (PyTorch Linear layout)
Tensor linear(const Tensor& x, const Tensor& w, DType out_dtype = DType::F32);

// ---- elementwise ------------------------------------------------------------------------
void add_(Tensor& out, const Tensor& a, const Tensor& b);
void mul_(Tensor& out, const Tensor& a, const Tensor& b);
void scale_(Tensor& out, const Tensor& a, float s);
void silu_(Tensor& out, const Tensor& x);
void swiglu_(Tensor& out, const Tensor& gate, const Tensor& up);
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
Tensor silu(const Tensor& x);
Tensor swiglu(const Tensor& gate, const Tensor& up);

// ---- normalisation and softmax ----------------------------------------------------------
// weight may be undefined (no weight). weight_offset = 1 gives Gemma's (1 + w).
void rmsnorm_(Tensor& out, const Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
Tensor rmsnorm(const Tensor& x, const Tensor& weight, float eps, float weight_offset = 0.0f);
void softmax_(Tensor& out, const Tensor& x, float scale = 1.0f);
Tensor softmax(const Tensor& x, float scale = 1.0f);

// ---- position encoding ------------------------------------------------------------------
// x (B, NH, T, HS); pos int32 (B|1, T); cos/sin f32 (P, n_rot/2). n_rot = 0 means HS.
void rope_(Tensor& out, const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot = 0);
Tensor rope(const Tensor& x, const Tensor& pos, const Tensor& cos, const Tensor& sin, int n_rot = 0);

// ---- indexing ---------------------------------------------------------------------------
// out[..., C] = table[ids[...], :]; ids are checked against the table size.
void embedding_(Tensor& out, const Tensor& table, const Tensor& ids);
Tensor embedding(const Tensor& table, const Tensor& ids, DType out_dtype = DType::F32);
void gather_(Tensor& out, const Tensor& src, int axis, const Tensor& index);
Tensor gather(const Tensor& src, int axis, const Tensor& index);
// dst[.., index[.., j, ..], ..] = src[.., j, ..] along axis (in place).
void scatter_(Tensor& dst, int axis, const Tensor& index, const Tensor& src);

// ---- copies -----------------------------------------------------------------------------
void copy_(Tensor& dst, const Tensor& src);  // same shape, any dtypes/strides, same device
Tensor cast(const Tensor& x, DType dtype);

// ---- attention -------------------------------------------------------------------------
// y (B, NH, n, HS) = softmax(scale q k^T, masked by position) v with GQA (head h uses group
// h / (NH/G)). k, v (B, G, T, HS); kpos int32 (B|1, G|1, T) = position of each slot's token;
// qpos int32 (B|1, n) = position of each query; slot j visible to query i iff
// kpos[j] <= qpos[i] (and kpos[j] > qpos[i] - window when window > 0).
// wsum (optional, f32 (B, G, T)) receives attention-weight sums (summed over queries,
// averaged over the heads of a group).
void sdpa_(Tensor& y, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kpos, const Tensor& qpos, float scale,
           int window = 0, Tensor* wsum = nullptr);

// ---- quantization (formats in kernels/common/quant_formats.h) ---------------------------
// Rows of x (..., n) -> bytes (..., quant_row_bytes(f, n)).
Tensor quantize(const Tensor& x, QuantFormat f);
void quantize_(Tensor& dst, const Tensor& x, QuantFormat f);
// Bytes (..., row_bytes) -> values (..., n) in out's dtype.
void dequantize_(Tensor& out, const Tensor& q, QuantFormat f);
const char* quant_format_name(QuantFormat f);  // "q8", "q4", "nf4", "q8_0", "q4_0"
QuantFormat quant_format_from_name(const std::string& name);  // throws kv::Error listing names

// ---- reductions over the last dimension -------------------------------------------------
// Results have the input's shape without its last dimension (f32, or f64 for f64 input).
Tensor sum_last(const Tensor& x);
Tensor max_last(const Tensor& x);
Tensor norm_last(const Tensor& x);

}  // namespace kv::ops
