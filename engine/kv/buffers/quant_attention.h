// SDPA straight from quantized rows (fp8_e4m3, fp8_e5m2, nvfp4, mxfp4, turboquant's TQK/TQV):
// every key and value row is decoded in a head-sized scratch row as it is read, so a decode
// step reads the codes once and no f32 copy of the cache exists (the quantized buffer's
// fused attention; formats in kernels/common/quant_formats.h). CPU tensors only.
#pragma once

#include <cstdint>

#include "engine/core/tensor.h"
#include "kernels/common/quant_formats.h"

namespace kv {

// Formats whose rows this attention reads (one row per head and token).
bool quant_attention_format(QuantFormat f);

// The stored rows of one layer: keys (B, G, L, rbk) and values (B, G, L, rbv) bytes, rows
// contiguous, head size D. levels: the TurboQuant key codebook (TQK formats only).
struct QuantRowsView {
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
    int64_t B = 0, G = 0, L = 0, D = 0, rbk = 0, rbv = 0;
    QuantFormat kf = QuantFormat::FP8_E4M3, vf = QuantFormat::FP8_E4M3;
    QuantLevels klevels{};
};

// y (B, NH, n, D) = softmax(scale q k^T) v over slots [0, T) with ops::sdpa_'s masking (slot j
// visible to query i iff kpos[j] <= qpos[i] and, with window w > 0, kpos[j] > qpos[i] - w; a
// query that sees no slot gets zeros), GQA (head h reads KV head h / (NH / G)) and weight sums
// wsum (B, G, T) f32 = (1/R) sum over the R heads of a group and the n queries of the weights.
// q, y: f32. Scratch, tracked as WORKSPACE, none of it O(T): per unit of work (a key range of a
// (batch row, KV head) pair; at most 4 per thread beyond one per pair) a max, a sum and a
// D-float accumulator per query row; per thread its queries and a 32-key tile of decoded keys
// and values with their scores.
void sdpa_quant_rows(Tensor& y, const Tensor& q, const QuantRowsView& kv, int64_t T, const Tensor& kpos, const Tensor& qpos,
                     float scale, int window, Tensor* wsum);

}  // namespace kv
