// The one table of Hugging Face tensor names and shapes per architecture (PyTorch Linear
// weights are [out, in]), and the check of a loaded TensorMap against it. The model code builds
// its parameters from expected_weight_shapes(), so names and shapes are defined only here.
// Shapes: V vocab, E hidden, NH heads, G kv heads, HS head_dim, I intermediate, P positions.
#pragma once

#include <string>
#include <vector>

#include "engine/core/model_config.h"

namespace kv {

struct WeightSpec {
    std::string name;       // "model.layers.3.self_attn.q_proj.weight"
    Shape shape;            // [out, in] for Linear weights
    bool optional = false;  // may be absent (lm_head.weight when embeddings are tied)
};

// In model order: embeddings, then per layer (attention, MLP), final norm, head.
//   Llama/Mistral/Qwen2/Qwen3: model.embed_tokens.weight [V,E]; model.layers.{i}.
//     input_layernorm.weight [E]; self_attn.q_proj.weight [NH·HS,E] (+.bias [NH·HS] if qkv_bias);
//     k_proj/v_proj.weight [G·HS,E] (+.bias [G·HS]); o_proj.weight [E,NH·HS] (+.bias [E] if o_bias);
//     self_attn.q_norm/k_norm.weight [HS] (qk_norm); post_attention_layernorm.weight [E];
//     mlp.gate_proj/up_proj.weight [I,E] (+.bias [I] if mlp_bias); mlp.down_proj.weight [E,I]
//     (+.bias [E]); model.norm.weight [E]; lm_head.weight [V,E] (optional when tied).
//   gpt-oss experts layers (N experts) in the MLP's place: mlp.router.weight [N,E] + .bias [N];
//     mlp.experts.gate_up_proj [N,E,2I] (x @ W; columns gate0, up0, gate1, ...) +
//     gate_up_proj_bias [N,2I]; mlp.experts.down_proj [N,I,E] + down_proj_bias [N,E].
//   GPT-2 (names without the "transformer." prefix; Conv1D weights are [in, out]): wte.weight
//     [V,E], wpe.weight [P,E], h.{i}.ln_1.{weight,bias} [E], h.{i}.attn.c_attn.weight [E,3E] +
//     bias [3E], h.{i}.attn.c_proj.weight [E,E] + bias [E], h.{i}.ln_2.{weight,bias} [E],
//     h.{i}.mlp.c_fc.weight [E,I] + bias [I], h.{i}.mlp.c_proj.weight [I,E] + bias [E],
//     ln_f.{weight,bias} [E]; lm_head.weight [V,E] optional when tied.
std::vector<WeightSpec> expected_weight_shapes(const ModelConfig& cfg);

struct WeightCheck {
    std::vector<std::string> missing;     // "model.norm.weight (expected (64,))"
    std::vector<std::string> misshaped;   // "name: expected (64, 64), got (32, 64)"
    std::vector<std::string> bad_dtype;   // "name: dtype i32, expected a float type"
    std::vector<std::string> unexpected;  // names not in the table

    bool ok() const { return missing.empty() && misshaped.empty() && bad_dtype.empty() && unexpected.empty(); }
    // One paragraph per non-empty list, at most 10 names each ("... and 37 more").
    std::string report() const;
};

// GPT-2's causal-mask buffers (h.{i}.attn.bias / attn.masked_bias) are not weights and are
// ignored rather than reported as unexpected.
WeightCheck check_weights(const ModelConfig& cfg, const TensorMap& weights);

// Throws kv::Error "<source>: weights do not match the <arch> config: ..." unless ok().
void require_weights(const ModelConfig& cfg, const TensorMap& weights, const std::string& source);

}  // namespace kv
