// QLoRA's frozen base (reference seed 002: bitsandbytes NF4, blocks of 64, f32 absmax): every
// linear weight of the blocks (q/k/v/o projections, gate/up/down) is quantized to NF4 and
// dequantized back into the model's activation dtype, in place. There is no packed NF4 matmul
// in the engine yet, so the forward runs on the round-tripped values: the numbers are those of
// an NF4 base (what bitsandbytes' dequantize-then-matmul computes), the memory is not; the
// packed size is reported so runs can show what an NF4 base would occupy.
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
};

QloraStats qlora_quantize_base(Transformer& model);

}  // namespace kv
