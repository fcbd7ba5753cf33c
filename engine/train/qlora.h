// QLoRA's frozen base (reference seed 002: bitsandbytes NF4, blocks of 64, f32 absmax): every
// linear weight of the blocks (q/k/v/o projections, gate/up/down) is quantized to NF4.
// On the CPU with f32 activations, and when every such weight's input width is a multiple of 64
// (so bitsandbytes' blocks over the flat weight are blocks of whole rows), the weights are then
// *kept* as packed NF4 (PackedFormat::NF4, engine/model/packed_weight.h): the matmuls read the
// blocks and the base occupies its NF4 size. Otherwise (bf16, f64, CUDA, ragged widths) they
// are dequantized back into the activation dtype in place: the numbers are an NF4 base's, the
// memory is not. Both give the same values: each weight is level * absmax, one f32 multiply.
// Embeddings, norms and lm_head stay as they are (bitsandbytes replaces Linear layers only,
// and LitGPT keeps the head in full precision).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/model/transformer.h"

namespace kv {

struct QloraStats {
    int64_t tensors = 0;      // weights quantized
    size_t dense_bytes = 0;   // their size in the activation dtype
    size_t nf4_bytes = 0;     // their packed NF4 size (n/2 bytes + 4 per block of 64)
    double max_abs_error = 0; // largest |w - nf4(w)|
    bool packed = false;      // the base is kept as packed NF4 (else round-tripped in place)
};

// keep_packed = false forces the in-place round trip (tests compare the two paths).
QloraStats qlora_quantize_base(Transformer& model, bool keep_packed = true);

}  // namespace kv
