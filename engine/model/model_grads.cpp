// Model gradients (see model_grads.h).
#include "model_grads.h"

#include "engine/core/error.h"
#include "packed_weight.h"

namespace kv {

namespace {
// Checkpoint names of a layer's norms: Llama's post_attention_layernorm is the pre-MLP norm,
// Gemma's and OLMo 2's the norm on the attention output.
struct NormNames {
    const char *attn, *attn_post, *mlp, *mlp_post;
};
NormNames norm_names(const ModelConfig& c) {
    if (c.norm_placement == NormPlacement::PRE)
        return {"input_layernorm.weight", "", "post_attention_layernorm.weight", ""};
    return {"input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight"};
}

Tensor like(const Tensor& w, const std::string& name) {
    if (!w.defined()) return {};
    if (is_packed(w))
        throw Error(str("full fine-tuning: '", name, "' is a packed ", packed_format_name(packed_format_of(w)),
                        " weight, which is frozen (LoRA/QLoRA train adapters over it)"),
                    "load the model with --model.weights f32 to fine-tune every weight");
    return Tensor::zeros(w.shape(), w.dtype(), {w.device(), MemCategory::GRADIENTS, name + " grad"});
}
}  // namespace

ModelGrads ModelGrads::zeros_like(const Transformer& m) {
    ModelGrads g;
    g.tied = m.tied_embeddings();
    g.embed = like(m.embedding(), "model.embed_tokens.weight");
    g.norm = like(m.final_norm_weight(), "model.norm.weight");
    if (!g.tied) g.lm_head = like(m.lm_head_weight(), "lm_head.weight");
    for (int l = 0; l < int(m.config().num_layers); ++l) {
        const LayerWeights& w = m.layer(l);
        const std::string p = str("model.layers.", l, ".");
        LayerGrads lg;
        const NormNames nn = norm_names(m.config());
        lg.attn_norm = like(w.attn_norm, p + nn.attn);
        lg.attn_post_norm = like(w.attn_post_norm, p + nn.attn_post);
        lg.mlp_post_norm = like(w.mlp_post_norm, p + nn.mlp_post);
        lg.wqkv = like(w.wqkv, p + "self_attn.qkv");
        lg.bqkv = like(w.bqkv, p + "self_attn.qkv.bias");
        lg.q_norm = like(w.q_norm, p + "self_attn.q_norm.weight");
        // A KV-shared layer's k norm (loaded with its checkpoint) never acts: its keys are its source's.
        lg.k_norm = m.config().kv_shared(l) ? Tensor() : like(w.k_norm, p + "self_attn.k_norm.weight");
        lg.wo = like(w.wo, p + "self_attn.o_proj.weight");
        lg.bo = like(w.bo, p + "self_attn.o_proj.bias");
        lg.mlp_norm = like(w.mlp_norm, p + nn.mlp);
        lg.w_gate_up = like(w.w_gate_up, p + "mlp.gate_up");
        lg.w_down = like(w.w_down, p + "mlp.down_proj.weight");
        lg.sinks = like(w.sinks, p + "self_attn.sinks");
        const bool qa = w.wq_a.defined();
        lg.wq_a = like(w.wq_a, p + "self_attn.q_a_proj.weight");
        lg.q_a_norm = like(w.q_a_norm, p + "self_attn.q_a_layernorm.weight");
        lg.wq = like(w.wq, p + (qa ? "self_attn.q_b_proj.weight" : "self_attn.q_proj.weight"));
        lg.wkv_a = like(w.wkv_a, p + "self_attn.kv_a_proj_with_mqa.weight");
        lg.kv_a_norm = like(w.kv_a_norm, p + "self_attn.kv_a_layernorm.weight");
        lg.wkv_b = like(w.wkv_b, p + "self_attn.kv_b_proj.weight");
        lg.conv_in = like(w.conv_in, p + "conv.in_proj.weight");
        lg.conv_taps = like(w.conv_taps, p + "conv.conv.weight");
        lg.conv_out = like(w.conv_out, p + "conv.out_proj.weight");
        lg.router = like(w.router, p + "mlp.router.weight");
        lg.router_bias = like(w.router_bias, p + "mlp.router.bias");
        lg.experts_gate_up = like(w.experts_gate_up, p + "mlp.experts.gate_up");
        lg.experts_gate_up_bias = like(w.experts_gate_up_bias, p + "mlp.experts.gate_up_bias");
        lg.experts_down = like(w.experts_down, p + "mlp.experts.down");
        lg.experts_down_bias = like(w.experts_down_bias, p + "mlp.experts.down_proj_bias");
        lg.laurel_left = like(w.laurel_left, p + "laurel.linear_left.weight");
        lg.laurel_right = like(w.laurel_right, p + "laurel.linear_right.weight");
        lg.laurel_norm = like(w.laurel_norm, p + "laurel.post_laurel_norm.weight");
        lg.altup_router_norm = like(w.altup_router_norm, p + "altup.router_norm.weight");
        lg.altup_router = like(w.altup_router, p + "altup.modality_router.weight");
        lg.altup_pred = like(w.altup_pred, p + "altup.prediction_coefs.weight");
        lg.altup_corr = like(w.altup_corr, p + "altup.correction_coefs.weight");
        lg.altup_out_scale = like(w.altup_out_scale, p + "altup.correct_output_scale");
        lg.pli_gate = like(w.pli_gate, p + "per_layer_input_gate.weight");
        lg.pli_proj = like(w.pli_proj, p + "per_layer_projection.weight");
        lg.pli_norm = like(w.pli_norm, p + "post_per_layer_input_norm.weight");
        g.layers.push_back(std::move(lg));
    }
    const AltUpWeights& aw = m.altup_weights();
    g.embed_per_layer = like(aw.embed_per_layer, "model.embed_tokens_per_layer.weight");
    g.per_layer_proj = like(aw.per_layer_proj, "model.per_layer_model_projection.weight");
    g.per_layer_norm = like(aw.per_layer_norm, "model.per_layer_projection_norm.weight");
    for (size_t i = 0; i < aw.proj.size(); ++i) {
        g.altup_proj.push_back(like(aw.proj[i], str("model.altup_projections.", i, ".weight")));
        g.altup_unembed.push_back(like(aw.unembed[i], str("model.altup_unembed_projections.", i, ".weight")));
    }
    return g;
}

void ModelGrads::zero() {
    for (Tensor* t : {&embed, &norm, &lm_head, &embed_per_layer, &per_layer_proj, &per_layer_norm})
        if (t->defined()) t->fill(0.0);
    for (auto* v : {&altup_proj, &altup_unembed})
        for (Tensor& t : *v) t.fill(0.0);
    for (auto& l : layers)
        for (Tensor* t : {&l.attn_norm, &l.wqkv, &l.bqkv, &l.q_norm, &l.k_norm, &l.wo, &l.bo, &l.attn_post_norm, &l.mlp_norm,
                          &l.mlp_post_norm, &l.w_gate_up, &l.w_down, &l.sinks, &l.wq_a, &l.q_a_norm, &l.wq, &l.wkv_a,
                          &l.kv_a_norm, &l.wkv_b, &l.conv_in, &l.conv_taps, &l.conv_out, &l.router, &l.router_bias,
                          &l.experts_gate_up, &l.experts_gate_up_bias, &l.experts_down, &l.experts_down_bias, &l.laurel_left,
                          &l.laurel_right, &l.laurel_norm, &l.altup_router_norm, &l.altup_router, &l.altup_pred, &l.altup_corr,
                          &l.altup_out_scale, &l.pli_gate, &l.pli_proj, &l.pli_norm})
            if (t->defined()) t->fill(0.0);
}

std::vector<std::pair<std::string, std::pair<Tensor*, Tensor*>>> ModelGrads::pairs(Transformer& m) {
    std::vector<std::pair<std::string, std::pair<Tensor*, Tensor*>>> out;
    out.push_back({"model.embed_tokens.weight", {&m.mutable_embedding(), &embed}});
    out.push_back({"model.norm.weight", {&m.mutable_final_norm_weight(), &norm}});
    if (!tied) out.push_back({"lm_head.weight", {&m.mutable_lm_head_weight(), &lm_head}});
    for (int l = 0; l < int(layers.size()); ++l) {
        LayerWeights& w = m.mutable_layer(l);
        LayerGrads& g = layers[size_t(l)];
        const std::string p = str("model.layers.", l, ".");
        const NormNames nn = norm_names(m.config());
        const std::pair<const char*, std::pair<Tensor*, Tensor*>> items[] = {
            {nn.attn, {&w.attn_norm, &g.attn_norm}},
            {nn.attn_post, {&w.attn_post_norm, &g.attn_post_norm}},
            {nn.mlp_post, {&w.mlp_post_norm, &g.mlp_post_norm}},
            {"self_attn.qkv", {&w.wqkv, &g.wqkv}},
            {"self_attn.qkv.bias", {&w.bqkv, &g.bqkv}},
            {"self_attn.q_norm.weight", {&w.q_norm, &g.q_norm}},
            {"self_attn.k_norm.weight", {&w.k_norm, &g.k_norm}},
            {"self_attn.o_proj.weight", {&w.wo, &g.wo}},
            {"self_attn.o_proj.bias", {&w.bo, &g.bo}},
            {nn.mlp, {&w.mlp_norm, &g.mlp_norm}},
            {"mlp.gate_up", {&w.w_gate_up, &g.w_gate_up}},
            {"mlp.down_proj.weight", {&w.w_down, &g.w_down}},
            {"self_attn.sinks", {&w.sinks, &g.sinks}},
            // latent attention: checkpoint names, rows in the loader's order (latent_attention.h)
            {"self_attn.q_a_proj.weight", {&w.wq_a, &g.wq_a}},
            {"self_attn.q_a_layernorm.weight", {&w.q_a_norm, &g.q_a_norm}},
            {w.wq_a.defined() ? "self_attn.q_b_proj.weight" : "self_attn.q_proj.weight", {&w.wq, &g.wq}},
            {"self_attn.kv_a_proj_with_mqa.weight", {&w.wkv_a, &g.wkv_a}},
            {"self_attn.kv_a_layernorm.weight", {&w.kv_a_norm, &g.kv_a_norm}},
            {"self_attn.kv_b_proj.weight", {&w.wkv_b, &g.wkv_b}},
            // short convolution: checkpoint names (the taps held (E, L), the checkpoint's (E, 1, L))
            {"conv.in_proj.weight", {&w.conv_in, &g.conv_in}},
            {"conv.conv.weight", {&w.conv_taps, &g.conv_taps}},
            {"conv.out_proj.weight", {&w.conv_out, &g.conv_out}},
            // experts: the router under its checkpoint names; the experts in the model's layout
            // (Linear, gate rows then up rows: moe_mlp.h), not the checkpoint's
            {"mlp.router.weight", {&w.router, &g.router}},
            {"mlp.router.bias", {&w.router_bias, &g.router_bias}},
            {"mlp.experts.gate_up", {&w.experts_gate_up, &g.experts_gate_up}},
            {"mlp.experts.gate_up_bias", {&w.experts_gate_up_bias, &g.experts_gate_up_bias}},
            {"mlp.experts.down", {&w.experts_down, &g.experts_down}},
            {"mlp.experts.down_proj_bias", {&w.experts_down_bias, &g.experts_down_bias}},
            // Gemma 3n: checkpoint names (altup.h); the correction coefficients as loaded (clamped)
            {"laurel.linear_left.weight", {&w.laurel_left, &g.laurel_left}},
            {"laurel.linear_right.weight", {&w.laurel_right, &g.laurel_right}},
            {"laurel.post_laurel_norm.weight", {&w.laurel_norm, &g.laurel_norm}},
            {"altup.router_norm.weight", {&w.altup_router_norm, &g.altup_router_norm}},
            {"altup.modality_router.weight", {&w.altup_router, &g.altup_router}},
            {"altup.prediction_coefs.weight", {&w.altup_pred, &g.altup_pred}},
            {"altup.correction_coefs.weight", {&w.altup_corr, &g.altup_corr}},
            {"altup.correct_output_scale", {&w.altup_out_scale, &g.altup_out_scale}},
            {"per_layer_input_gate.weight", {&w.pli_gate, &g.pli_gate}},
            {"per_layer_projection.weight", {&w.pli_proj, &g.pli_proj}},
            {"post_per_layer_input_norm.weight", {&w.pli_norm, &g.pli_norm}}};
        for (const auto& [name, wg] : items)
            if (wg.second->defined()) out.push_back({p + name, wg});
    }
    AltUpWeights& aw = m.mutable_altup_weights();
    if (embed_per_layer.defined()) {
        out.push_back({"model.embed_tokens_per_layer.weight", {&aw.embed_per_layer, &embed_per_layer}});
        out.push_back({"model.per_layer_model_projection.weight", {&aw.per_layer_proj, &per_layer_proj}});
        out.push_back({"model.per_layer_projection_norm.weight", {&aw.per_layer_norm, &per_layer_norm}});
    }
    for (size_t i = 0; i < altup_proj.size(); ++i) {
        out.push_back({str("model.altup_projections.", i, ".weight"), {&aw.proj[i], &altup_proj[i]}});
        out.push_back({str("model.altup_unembed_projections.", i, ".weight"), {&aw.unembed[i], &altup_unembed[i]}});
    }
    return out;
}

}  // namespace kv
