// llama.cpp tensor names -> Hugging Face names for the Llama/Qwen2 layout and the families
// whose norms or projections differ (Gemma 2/3, Phi-3, OLMo 2)
// ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"). Names only: shapes,
// layouts and which tensors a model needs are gguf_model.cpp's business.
#pragma once

#include <cstdint>
#include <string>

#include "engine/core/model_config.h"

namespace kv {

// What a family's names depend on: where its norms sit (llama.cpp's ffn_norm is Llama's
// post_attention_layernorm but Gemma's pre_feedforward_layernorm) and whether q/k/v and
// gate/up are stored fused (Phi-3: attn_qkv, and ffn_up holding gate then up).
struct GgufLayout {
    NormPlacement norms = NormPlacement::PRE;
    bool fused = false;
};

struct GgufHfName {
    std::string hf;      // Hugging Face name; "" when the GGUF name is not part of the layout
    int64_t layer = -1;  // N of blk.N, else -1
};

// token_embd -> model.embed_tokens, output_norm -> model.norm, output -> lm_head,
// blk.N.{attn_q, attn_k, attn_v, attn_output} -> model.layers.N.self_attn.{q,k,v,o}_proj,
// blk.N.{ffn_gate, ffn_up, ffn_down} -> model.layers.N.mlp.{gate,up,down}_proj,
// blk.N.attn_norm -> input_layernorm, blk.N.ffn_norm -> post_attention_layernorm,
// blk.N.attn_{q,k}_norm -> self_attn.{q,k}_norm; each with its ".weight" or ".bias" suffix kept.
// Other layouts: BOTH (Gemma) ffn_norm -> pre_feedforward_layernorm, attn_post_norm ->
// post_attention_layernorm, ffn_post_norm -> post_feedforward_layernorm; POST (OLMo 2) only the
// last two; fused attn_qkv -> self_attn.qkv_proj and ffn_up -> mlp.gate_up_proj.
GgufHfName gguf_to_hf_name(const std::string& gguf_name, const GgufLayout& layout = {});

// Inverse of gguf_to_hf_name ("" when unknown); used by writers and tests.
std::string hf_to_gguf_name(const std::string& hf_name, const GgufLayout& layout = {});

}  // namespace kv
