// gpt-oss's experts from llama.cpp's GGUF layout to transformers' (GptOssExperts), the tensors
// the model reads. llama.cpp's converter transposes each expert to [out, in] and splits the
// interleaved gate/up columns of gate_up_proj (gate = even columns, up = odd) into
// ffn_gate_exps / ffn_up_exps, or stacks them as ffn_gate_up_exps (all gate rows, then all up
// rows); its down_proj is transposed to [E, I] per expert.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/model_config.h"
#include "engine/core/tensor.h"

namespace kv {

// In `tensors`, for the layer prefix `p` ("model.layers.3."), replaces
//   p.mlp.experts.{gate,up}_proj.{weight [N, I, E], bias [N, I]}
//     or p.mlp.experts.gate_up_proj.{weight [N, 2I, E], bias [N, 2I]} (gate, then up)
//   p.mlp.experts.down_proj.{weight [N, E, I], bias [N, E]}
// by transformers' p.mlp.experts.gate_up_proj [N, E, 2I] (column 2j gate j, 2j + 1 up j),
// gate_up_proj_bias [N, 2I] (interleaved alike), down_proj [N, I, E], down_proj_bias [N, E].
// Shapes were checked by the caller; the dtype (F32 or BF16) is kept.
void gguf_experts_to_hf(TensorMap& tensors, const std::string& p, int64_t N, int64_t I, int64_t E);

}  // namespace kv
