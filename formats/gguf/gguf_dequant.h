// Dequantization of GGUF tensor data (any dequantizable ggml type) to f32 or bf16, whole rows
// at a time, multi-threaded over rows with OpenMP. Works on raw byte pointers: no tensors, no
// files, so the fuzz target can use it too. Block layouts live in gguf_blocks.h.
#pragma once

#include <cstdint>
#include <string>

#include "formats/gguf/gguf_types.h"
#include "kernels/common/dtype.h"

namespace kv {

// True for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4.
bool gguf_can_dequantize(GgmlType t);

// Bytes holding `n` elements of type `t` (n must be a multiple of the block size).
uint64_t gguf_bytes_for(GgmlType t, int64_t n);

// Single-threaded: `n` elements (a multiple of the block size) from `src` into `dst`.
// Throws kv::Error naming `what` when the type cannot be dequantized or n is not whole blocks.
void gguf_dequantize_f32(GgmlType t, const uint8_t* src, int64_t n, float* dst, const std::string& what = "tensor");
void gguf_dequantize_bf16(GgmlType t, const uint8_t* src, int64_t n, uint16_t* dst,
                          const std::string& what = "tensor");

// Validation shared by the row functions: throws kv::Error naming `what` unless `t` can be
// dequantized, row_len is whole blocks and `out` is F32 or BF16.
void gguf_check_dequantizable(GgmlType t, int64_t row_len, DType out, const std::string& what);

// Single-threaded worker behind gguf_dequantize_rows: source rows [r0, r1) only, no checks
// (call gguf_check_dequantizable first). Lets callers run many tensors in one parallel loop.
void gguf_dequantize_row_range(GgmlType t, const uint8_t* src, int64_t r0, int64_t r1, int64_t row_len, DType out,
                               void* dst, const int64_t* row_map);

// Multi-threaded over rows. `src` holds n_rows ggml rows of row_len elements each (a ggml row
// is one PyTorch row); source row r is written to destination row row_map[r] (or r when
// row_map is null) of `dst`, a row-major [n_rows, row_len] buffer of `out` (F32 or BF16).
// row_map must be a permutation of [0, n_rows); it is how Q/K un-permutation avoids a copy.
void gguf_dequantize_rows(GgmlType t, const uint8_t* src, int64_t n_rows, int64_t row_len, DType out, void* dst,
                          const int64_t* row_map = nullptr, const std::string& what = "tensor");

}  // namespace kv
