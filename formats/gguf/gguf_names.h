// llama.cpp tensor names -> Hugging Face names for the Llama/Qwen2 layout
// ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"). Names only: shapes,
// layouts and which tensors a model needs are gguf_model.cpp's business.
#pragma once

#include <cstdint>
#include <string>

namespace kv {

struct GgufHfName {
    std::string hf;      // Hugging Face name; "" when the GGUF name is not part of the layout
    int64_t layer = -1;  // N of blk.N, else -1
};

// token_embd -> model.embed_tokens, output_norm -> model.norm, output -> lm_head,
// blk.N.{attn_q, attn_k, attn_v, attn_output} -> model.layers.N.self_attn.{q,k,v,o}_proj,
// blk.N.{ffn_gate, ffn_up, ffn_down} -> model.layers.N.mlp.{gate,up,down}_proj,
// blk.N.attn_norm -> input_layernorm, blk.N.ffn_norm -> post_attention_layernorm;
// each with its ".weight" or ".bias" suffix kept.
GgufHfName gguf_to_hf_name(const std::string& gguf_name);

// Inverse of gguf_to_hf_name ("" when unknown); used by writers and tests.
std::string hf_to_gguf_name(const std::string& hf_name);

}  // namespace kv
