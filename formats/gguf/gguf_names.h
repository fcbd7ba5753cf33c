// llama.cpp tensor names -> Hugging Face names for the Llama/Qwen2 layout and the families
// whose norms, projections or MLPs differ (Gemma 2/3, Phi-3, OLMo 2, gpt-oss)
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
    // gpt-oss: the pre-MLP norm (HF post_attention_layernorm) is llama.cpp's post_attention_norm,
    // not ffn_norm.
    bool pre_mlp_norm_is_post_attention = false;
    // LFM2: the final norm is llama.cpp's token_embd_norm (its converter's name for
    // model.embedding_norm, which LFM2 applies after the last layer); output_norm is read too.
    bool short_conv = false;
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
// Other layouts: BOTH (Gemma) ffn_norm -> pre_feedforward_layernorm, post_attention_norm ->
// post_attention_layernorm, post_ffw_norm -> post_feedforward_layernorm; POST (OLMo 2) only the
// last two; fused attn_qkv -> self_attn.qkv_proj and ffn_up -> mlp.gate_up_proj.
// gpt-oss: blk.N.attn_sinks.weight -> self_attn.sinks (no suffix), ffn_gate_inp -> mlp.router,
// ffn_{gate,up,gate_up,down}_exps -> mlp.experts.{gate,up,gate_up,down}_proj with their
// ".weight"/".bias": llama.cpp's stacked per-expert [out, in] matrices, which the loader turns
// into transformers' tensors (gguf_experts.h); transformers' own expert tensors carry no suffix.
// DeepSeek-V2: attn_q_a, attn_q_a_norm, attn_q_b, attn_kv_a_mqa, attn_kv_a_norm, attn_kv_b ->
// self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj};
// attn_k_b / attn_v_b -> self_attn.{k,v}_b_proj, the loader's names for the two halves of
// kv_b_proj newer converters write (gguf_latent.h joins them).
// LFM2: shortconv.{conv, in_proj, out_proj} -> conv.{conv, in_proj, out_proj}; with short_conv,
// token_embd_norm -> model.norm.
GgufHfName gguf_to_hf_name(const std::string& gguf_name, const GgufLayout& layout = {});

// Inverse of gguf_to_hf_name ("" when unknown); used by writers and tests.
std::string hf_to_gguf_name(const std::string& hf_name, const GgufLayout& layout = {});

}  // namespace kv
