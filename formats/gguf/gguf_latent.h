// DeepSeek-V2's kv_b_proj from the halves newer llama.cpp converters write for MLA's absorbed
// form: attn_k_b [NH, r, D_nope] (each head's key rows transposed) and attn_v_b [NH, D_v, r].
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/model_config.h"
#include "engine/core/tensor.h"

namespace kv {

// In `tensors`, for the layer prefix `p`, replaces p.self_attn.k_b_proj.weight [NH, r, D_nope]
// and p.self_attn.v_b_proj.weight [NH, D_v, r] by transformers' p.self_attn.kv_b_proj.weight
// [NH (D_nope + D_v), r]: head h's rows are its D_nope key rows, then its D_v value rows.
// Shapes were checked by the caller; the dtype (F32 or BF16) is kept.
void gguf_join_kv_b(TensorMap& tensors, const std::string& p, int64_t NH, int64_t r, int64_t D_nope, int64_t D_v);

}  // namespace kv
