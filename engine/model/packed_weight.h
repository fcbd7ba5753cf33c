// Packed weights: a Linear weight W [out, in] kept in a ggml block format instead of floats.
// Stored as a u8 tensor [out, blocks per row, block bytes]; the block size in bytes names the
// format (every PackedFormat has a different one), so a packed weight is an ordinary Tensor
// that views, slices along rows and stacks like any other. The matmul kernels read the
// blocks directly (op.h: MATMUL with a u8 weight); nothing else may read them as numbers.
#pragma once

#include "engine/core/tensor.h"
#include "kernels/common/packed_blocks.h"

namespace kv {

// The format of a packed weight; NONE for any other tensor.
inline PackedFormat packed_format_of(const Tensor& w) {
    if (!w.defined() || w.dtype() != DType::U8 || w.ndim() != 3) return PackedFormat::NONE;
    for (int f = 1; f < int(PackedFormat::COUNT); ++f)
        if (packed_block_bytes(PackedFormat(f)) == w.size(2)) return PackedFormat(f);
    return PackedFormat::NONE;
}
inline bool is_packed(const Tensor& w) { return packed_format_of(w) != PackedFormat::NONE; }

// Logical [out, in] of a weight, packed or not (a row-grouped format's size(0) counts groups).
inline Shape weight_shape(const Tensor& w) {
    const PackedFormat f = packed_format_of(w);
    if (f == PackedFormat::NONE) return w.shape();
    return Shape{w.size(0) * packed_block_rows(f), w.size(1) * packed_block_cols(f)};
}

// Rows [r0, r1) of a packed weight dequantized to f32 into dst (row-major, (r1 - r0) x in).
// Host memory only (tests, the embedding lookup, weight checks).
void packed_rows_to_f32(const Tensor& w, int64_t r0, int64_t r1, float* dst);

// A packed weight dequantized to a new f32 tensor [out, in] (tests and fallbacks).
Tensor packed_to_f32(const Tensor& w, const TensorOptions& opt = {});

// x (..., in) @ W^T -> (..., out) (a Linear), for packed and float weights alike. Packed
// weights need f32 activations on the CPU (the packed matmul kernels, op.h).
Tensor linear_any(const Tensor& x, const Tensor& w, DType out_dtype = DType::F32);
// dy (..., out) @ W -> (..., in): the gradient of a Linear w.r.t. its input.
Tensor linear_input_grad_any(const Tensor& dy, const Tensor& w, DType out_dtype);

}  // namespace kv
