// HF-named model weights (see model_weights.h).
#include "model_weights.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/model/latent_attention.h"
#include "engine/model/moe_mlp.h"
#include "engine/model/packed_weight.h"
#include "engine/ops/ops.h"

namespace kv {

namespace {
// Views of the live tensors under HF names; packed weights (GGUF blocks, a QLoRA NF4 base) are
// row slices of their blocks, readable only through packed_to_f32.
TensorMap state_dict_views(const Transformer& m) {
    const ModelConfig& c = m.config();
    const int64_t Q = c.q_dim(), K = c.kv_dim(), I = c.intermediate_size;
    TensorMap w;
    w["model.embed_tokens.weight"] = m.embedding();
    w["model.norm.weight"] = m.final_norm_weight();
    if (!m.tied_embeddings()) w["lm_head.weight"] = m.lm_head_weight();
    for (int l = 0; l < int(c.num_layers); ++l) {
        const LayerWeights& L = m.layer(l);
        const std::string p = str("model.layers.", l, ".");
        // Names by the family's layout (as formats/io/weight_names.cpp lists them): norms by
        // placement, q/k/v and gate/up fused where the checkpoint stores them so (Phi-3).
        if (L.attn_norm.defined()) w[p + "input_layernorm.weight"] = L.attn_norm;
        const bool conv = c.short_conv_layer(l);
        if (conv) {
            // the convolution's own names (short_conv.h); the taps in nn.Conv1d's (E, 1, L)
            w[p + "conv.in_proj.weight"] = L.conv_in;
            w[p + "conv.conv.weight"] = L.conv_taps.reshape({L.conv_taps.size(0), 1, L.conv_taps.size(1)});
            w[p + "conv.out_proj.weight"] = L.conv_out;
        } else if (c.latent_attention()) {
            // copies in the checkpoint's layout (load_model_state_dict loads them through the loader)
            for (auto& [name, t] : latent_state_dict(c, L, p)) w[name] = t;
        } else if (c.fused_projections) {
            w[p + "self_attn.qkv_proj.weight"] = L.wqkv;
        } else if (c.kv_shared(l)) {  // Gemma 3n: a KV-shared layer reads q_proj only (its k/v are its source's)
            w[p + "self_attn.q_proj.weight"] = L.wqkv;
            if (L.kv_unread.defined()) {  // its checkpoint's k_proj / v_proj, unread and untrained, written back
                w[p + "self_attn.k_proj.weight"] = L.kv_unread.slice(0, 0, K);
                w[p + "self_attn.v_proj.weight"] = L.kv_unread.slice(0, K, 2 * K);
            }
        } else {
            w[p + "self_attn.q_proj.weight"] = L.wqkv.slice(0, 0, Q);
            w[p + "self_attn.k_proj.weight"] = L.wqkv.slice(0, Q, Q + K);
            w[p + "self_attn.v_proj.weight"] = L.wqkv.slice(0, Q + K, Q + 2 * K);
        }
        if (L.bqkv.defined()) {
            w[p + "self_attn.q_proj.bias"] = L.bqkv.slice(0, 0, Q);
            w[p + "self_attn.k_proj.bias"] = L.bqkv.slice(0, Q, Q + K);
            w[p + "self_attn.v_proj.bias"] = L.bqkv.slice(0, Q + K, Q + 2 * K);
        }
        if (L.q_norm.defined()) {
            w[p + "self_attn.q_norm.weight"] = L.q_norm;
            w[p + "self_attn.k_norm.weight"] = L.k_norm;
        }
        if (!c.latent_attention() && !conv) w[p + "self_attn.o_proj.weight"] = L.wo;
        if (L.bo.defined()) w[p + "self_attn.o_proj.bias"] = L.bo;
        if (c.norm_placement == NormPlacement::PRE) {
            w[p + "post_attention_layernorm.weight"] = L.mlp_norm;
        } else {
            w[p + "post_attention_layernorm.weight"] = L.attn_post_norm;
            w[p + "post_feedforward_layernorm.weight"] = L.mlp_post_norm;
            if (L.mlp_norm.defined()) w[p + "pre_feedforward_layernorm.weight"] = L.mlp_norm;
        }
        if (c.experts_layer(l)) {
            // copies in the checkpoint's layout (load_model_state_dict loads them through the loader)
            for (auto& [name, t] : experts_state_dict(c, L, p)) w[name] = t;
        } else if (c.fused_projections) {
            w[p + "mlp.gate_up_proj.weight"] = L.w_gate_up;
        } else {
            w[p + "mlp.gate_proj.weight"] = L.w_gate_up.slice(0, 0, I);
            w[p + "mlp.up_proj.weight"] = L.w_gate_up.slice(0, I, 2 * I);
        }
        if (!c.experts_layer(l)) w[p + "mlp.down_proj.weight"] = L.w_down;
        if (L.sinks.defined()) w[p + "self_attn.sinks"] = L.sinks;
        if (c.altup_enabled()) {  // Gemma 3n's layer tensors under their checkpoint names (altup.h; the correction coefficients as loaded, clamped)
            for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"laurel.linear_left.weight", &L.laurel_left},
                                          {"laurel.linear_right.weight", &L.laurel_right},
                                          {"laurel.post_laurel_norm.weight", &L.laurel_norm},
                                          {"altup.router_norm.weight", &L.altup_router_norm},
                                          {"altup.modality_router.weight", &L.altup_router},
                                          {"altup.prediction_coefs.weight", &L.altup_pred},
                                          {"altup.correction_coefs.weight", &L.altup_corr},
                                          {"altup.correct_output_scale", &L.altup_out_scale},
                                          {"per_layer_input_gate.weight", &L.pli_gate},
                                          {"per_layer_projection.weight", &L.pli_proj},
                                          {"post_per_layer_input_norm.weight", &L.pli_norm}})
                w[p + name] = *t;
        }
    }
    if (c.altup_enabled()) {
        const AltUpWeights& aw = m.altup_weights();
        w["model.embed_tokens_per_layer.weight"] = aw.embed_per_layer;
        w["model.per_layer_model_projection.weight"] = aw.per_layer_proj;
        w["model.per_layer_projection_norm.weight"] = aw.per_layer_norm;
        for (size_t i = 0; i < aw.proj.size(); ++i) {
            w[str("model.altup_projections.", i, ".weight")] = aw.proj[i];
            w[str("model.altup_unembed_projections.", i, ".weight")] = aw.unembed[i];
        }
    }
    return w;
}
}  // namespace

TensorMap model_state_dict(const Transformer& m) {
    if (m.has_packed_weights())
        throw Error("model weights: the model keeps packed (GGUF block or QLoRA NF4) weights, which have no float state dict to read or write",
                    "load the model with --model.weights f32 (QLoRA: merge into a saved model with save_merged)");
    return state_dict_views(m);
}

void load_model_state_dict(Transformer& m, const TensorMap& weights) {
    TensorMap dst = model_state_dict(m);  // views into the live tensors
    for (auto& [name, t] : dst) {
        auto it = weights.find(name);
        if (it == weights.end()) throw Error(str("model weights: missing tensor '", name, "' (expected shape ", t.shape().str(), ")"));
        if (it->second.shape() != t.shape())
            throw Error(str("model weights: tensor '", name, "' has shape ", it->second.shape().str(), ", expected ", t.shape().str()));
        t.copy_from(it->second.device() == t.device() ? it->second : it->second.to(t.device()));
    }
    // The experts' entries above were copies too: loaded through the loader's layout change.
    for (int l = 0; l < int(m.config().num_layers); ++l) {
        if (!m.config().experts_layer(l)) continue;
        LayerWeights& L = m.mutable_layer(l);
        LayerWeights fresh;
        load_experts(m.config(), weights, str("model.layers.", l, "."), L.router.dtype(), L.router.device(), fresh);
        for (auto [dst, src] : {std::pair{&L.router, &fresh.router},
                                {&L.router_bias, &fresh.router_bias},
                                {&L.experts_gate_up, &fresh.experts_gate_up},
                                {&L.experts_gate_up_bias, &fresh.experts_gate_up_bias},
                                {&L.experts_down, &fresh.experts_down},
                                {&L.experts_down_bias, &fresh.experts_down_bias}})
            dst->copy_from(*src);
    }
    // Latent attention's entries above were copies: its tensors are loaded through the loader's permutations.
    if (m.config().latent_attention())
        for (int l = 0; l < int(m.config().num_layers); ++l) {
            LayerWeights& L = m.mutable_layer(l);
            LayerWeights fresh;
            load_latent_attention(m.config(), weights, str("model.layers.", l, "."), L.wkv_a.dtype(), L.wkv_a.device(), fresh);
            for (auto [dst, src] : {std::pair{&L.wq_a, &fresh.wq_a},
                                    {&L.q_a_norm, &fresh.q_a_norm},
                                    {&L.wq, &fresh.wq},
                                    {&L.wkv_a, &fresh.wkv_a},
                                    {&L.kv_a_norm, &fresh.kv_a_norm},
                                    {&L.wkv_b, &fresh.wkv_b},
                                    {&L.wo, &fresh.wo}})
                if (dst->defined()) dst->copy_from(*src);
        }
}

TensorMap merged_lora_state_dict(const Transformer& m, const Lora& lora) {
    TensorMap out;
    // a fresh f32 copy of every weight; a packed base (QLoRA's NF4) is dequantized: the merged
    // model is the NF4 base plus the adapters, as with bitsandbytes' merge_and_unload
    for (const auto& [name, t] : state_dict_views(m))
        out[name] = is_packed(t) ? packed_to_f32(t, {t.device(), MemCategory::WORKSPACE, name}) : t.clone();
    if (m.tied_embeddings()) {
        for (const auto& a : lora.adapters())
            if (a.layer < 0)
                throw Error("merging a LoRA adapter on lm_head into tied embeddings would change the input embeddings too",
                            "save the adapters instead (adapter_model.safetensors)");
    }
    const ModelConfig& c = m.config();
    // Latent attention's adapted weights are stored permuted and padded: merged in that layout,
    // then written out in the checkpoint's.
    auto latent_site = [&](const LoraAdapter& a) {
        return c.latent_attention() && a.layer >= 0 &&
               (a.site == LinearSite::QKV || a.site == LinearSite::KV_A || a.site == LinearSite::KV_B ||
                a.site == LinearSite::O);
    };
    for (int l = 0; c.latent_attention() && l < int(c.num_layers); ++l) {
        const auto& ads = lora.adapters();
        if (std::none_of(ads.begin(), ads.end(), [&](const LoraAdapter& a) { return latent_site(a) && a.layer == l; }))
            continue;
        LayerWeights L = m.layer(l);
        for (Tensor* t : {&L.wq, &L.wkv_a, &L.wkv_b, &L.wo}) *t = t->clone();  // never the live weights
        for (const auto& a : ads) {
            if (!latent_site(a) || a.layer != l) continue;
            Tensor& w = a.site == LinearSite::QKV    ? L.wq
                        : a.site == LinearSite::KV_A ? L.wkv_a
                        : a.site == LinearSite::KV_B ? L.wkv_b
                                                     : L.wo;
            ops::matmul_(w, a.B, a.A, lora.scale(), 1.0f);  // W += s B A
        }
        for (auto& [name, t] : latent_state_dict(c, L, str("model.layers.", l, "."))) out[name] = t;
    }
    for (const auto& a : lora.adapters()) {
        if (latent_site(a)) continue;
        // a.module is "model.layers.3.self_attn.q_proj" or "lm_head": its weight is (out, in).
        auto it = out.find(a.module + ".weight");
        if (it == out.end()) throw Error(str("LoRA merge: no weight '", a.module, ".weight'"));
        Tensor w = it->second;  // a fresh contiguous copy: update in place
        ops::matmul_(w, a.B, a.A, lora.scale(), 1.0f);  // W += s B A
    }
    return out;
}

}  // namespace kv
