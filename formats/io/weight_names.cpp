// Expected tensor names/shapes per architecture and the weight check (see weight_names.h).
#include "formats/io/weight_names.h"

#include <set>

#include "engine/core/error.h"
#include "formats/io/safetensors_dtype.h"

namespace kv {

namespace {

void llama_family(const ModelConfig& c, std::vector<WeightSpec>& w) {
    const int64_t V = c.vocab_size, E = c.hidden_size, I = c.intermediate_size, HS = c.head_dim;
    const int64_t Q = c.q_dim(), KV = c.kv_dim();  // NH·HS, G·HS
    w.push_back({"model.embed_tokens.weight", {V, E}});
    for (int64_t i = 0; i < c.num_layers; ++i) {
        const std::string p = str("model.layers.", i, ".");
        // Norms by placement (ModelConfig::norm_placement): post_attention_layernorm is Llama's
        // pre-MLP norm and Gemma's / OLMo 2's norm on the attention output.
        if (c.norm_placement != NormPlacement::POST) w.push_back({p + "input_layernorm.weight", {E}});
        if (c.norm_placement == NormPlacement::BOTH) w.push_back({p + "pre_feedforward_layernorm.weight", {E}});
        if (c.norm_placement != NormPlacement::PRE) w.push_back({p + "post_feedforward_layernorm.weight", {E}});
        if (c.short_conv_layer(i)) {  // LFM2's gated short convolution (B, C, x rows of in_proj; depthwise taps)
            w.push_back({p + "conv.in_proj.weight", {3 * E, E}});
            w.push_back({p + "conv.conv.weight", {E, 1, c.conv_kernel}});
            w.push_back({p + "conv.out_proj.weight", {E, E}});
        } else if (c.latent_attention()) {  // DeepSeek-V2: queries (optionally through a latent), the KV latent and its expansion
            const LatentAttention& a = c.latent;
            if (a.q_lora_rank > 0) {
                w.push_back({p + "self_attn.q_a_proj.weight", {a.q_lora_rank, E}});
                w.push_back({p + "self_attn.q_a_layernorm.weight", {a.q_lora_rank}});
                w.push_back({p + "self_attn.q_b_proj.weight", {Q, a.q_lora_rank}});
            } else {
                w.push_back({p + "self_attn.q_proj.weight", {Q, E}});
            }
            w.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", {a.kv_lora_rank + a.qk_rope_head_dim, E}});
            w.push_back({p + "self_attn.kv_a_layernorm.weight", {a.kv_lora_rank}});
            w.push_back({p + "self_attn.kv_b_proj.weight", {c.num_heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}});
        } else if (c.fused_projections) {  // Phi-3: q, k, v rows in one matrix
            w.push_back({p + "self_attn.qkv_proj.weight", {Q + 2 * KV, E}});
        } else {
            w.push_back({p + "self_attn.q_proj.weight", {Q, E}});
            if (c.qkv_bias) w.push_back({p + "self_attn.q_proj.bias", {Q}});
            w.push_back({p + "self_attn.k_proj.weight", {KV, E}});
            if (c.qkv_bias) w.push_back({p + "self_attn.k_proj.bias", {KV}});
            w.push_back({p + "self_attn.v_proj.weight", {KV, E}});
            if (c.qkv_bias) w.push_back({p + "self_attn.v_proj.bias", {KV}});
        }
        if (!c.short_conv_layer(i)) w.push_back({p + "self_attn.o_proj.weight", {E, c.num_heads * c.v_head_dim()}});
        if (c.o_bias) w.push_back({p + "self_attn.o_proj.bias", {E}});
        if (c.attention_sinks) w.push_back({p + "self_attn.sinks", {c.num_heads}});
        if (c.qk_norm && !c.short_conv_layer(i)) {
            w.push_back({p + "self_attn.q_norm.weight", {c.qk_norm_whole ? Q : HS}});
            w.push_back({p + "self_attn.k_norm.weight", {c.qk_norm_whole ? KV : HS}});
        }
        w.push_back({p + "post_attention_layernorm.weight", {E}});
        if (c.experts_layer(i)) {  // gpt-oss's experts (GptOssMLP): router, then stacked experts in x @ W form
            const int64_t N = c.moe.num_experts;
            w.push_back({p + "mlp.router.weight", {N, E}});
            w.push_back({p + "mlp.router.bias", {N}});
            w.push_back({p + "mlp.experts.gate_up_proj", {N, E, 2 * I}});  // gate and up columns interleaved
            w.push_back({p + "mlp.experts.gate_up_proj_bias", {N, 2 * I}});
            w.push_back({p + "mlp.experts.down_proj", {N, I, E}});
            w.push_back({p + "mlp.experts.down_proj_bias", {N, E}});
            continue;
        }
        if (c.fused_projections) {  // Phi-3: gate rows, then up rows
            w.push_back({p + "mlp.gate_up_proj.weight", {2 * I, E}});
        } else {
            w.push_back({p + "mlp.gate_proj.weight", {I, E}});
            if (c.mlp_bias) w.push_back({p + "mlp.gate_proj.bias", {I}});
            w.push_back({p + "mlp.up_proj.weight", {I, E}});
            if (c.mlp_bias) w.push_back({p + "mlp.up_proj.bias", {I}});
        }
        w.push_back({p + "mlp.down_proj.weight", {E, I}});
        if (c.mlp_bias) w.push_back({p + "mlp.down_proj.bias", {E}});
        if (c.altup_enabled()) {  // Gemma 3n: AltUp's router and coefficients, LAUREL, the per-layer input's maps
            const int64_t A = c.altup.num_inputs, P = c.altup.per_layer_dim, R = c.altup.laurel_rank;
            w.push_back({p + "altup.correct_output_scale", {E}});
            w.push_back({p + "altup.correction_coefs.weight", {A, A}});
            w.push_back({p + "altup.prediction_coefs.weight", {A * A, A}});
            w.push_back({p + "altup.modality_router.weight", {A, E}});
            w.push_back({p + "altup.router_norm.weight", {E}});
            w.push_back({p + "laurel.linear_left.weight", {R, E}});
            w.push_back({p + "laurel.linear_right.weight", {E, R}});
            w.push_back({p + "laurel.post_laurel_norm.weight", {E}});
            w.push_back({p + "per_layer_input_gate.weight", {P, E}});
            w.push_back({p + "per_layer_projection.weight", {E, P}});
            w.push_back({p + "post_per_layer_input_norm.weight", {E}});
        }
    }
    if (c.altup_enabled()) {
        const int64_t L = c.num_layers, P = c.altup.per_layer_dim;
        w.push_back({"model.embed_tokens_per_layer.weight", {c.altup.per_layer_vocab, L * P}});
        w.push_back({"model.per_layer_model_projection.weight", {L * P, E}});
        w.push_back({"model.per_layer_projection_norm.weight", {P}});
        for (int64_t i = 0; i + 1 < c.altup.num_inputs; ++i) {
            w.push_back({str("model.altup_projections.", i, ".weight"), {E, E}});
            w.push_back({str("model.altup_unembed_projections.", i, ".weight"), {E, E}});
        }
    }
    w.push_back({"model.norm.weight", {E}});
}

void gpt2(const ModelConfig& c, std::vector<WeightSpec>& w) {
    const int64_t V = c.vocab_size, E = c.hidden_size, I = c.intermediate_size, P = c.max_position_embeddings;
    w.push_back({"wte.weight", {V, E}});
    w.push_back({"wpe.weight", {P, E}});
    for (int64_t i = 0; i < c.num_layers; ++i) {
        const std::string p = str("h.", i, ".");
        w.push_back({p + "ln_1.weight", {E}});
        w.push_back({p + "ln_1.bias", {E}});
        w.push_back({p + "attn.c_attn.weight", {E, 3 * E}});  // Conv1D: [in, out], q|k|v concatenated
        w.push_back({p + "attn.c_attn.bias", {3 * E}});
        w.push_back({p + "attn.c_proj.weight", {E, E}});
        w.push_back({p + "attn.c_proj.bias", {E}});
        w.push_back({p + "ln_2.weight", {E}});
        w.push_back({p + "ln_2.bias", {E}});
        w.push_back({p + "mlp.c_fc.weight", {E, I}});
        w.push_back({p + "mlp.c_fc.bias", {I}});
        w.push_back({p + "mlp.c_proj.weight", {I, E}});
        w.push_back({p + "mlp.c_proj.bias", {E}});
    }
    w.push_back({"ln_f.weight", {E}});
    w.push_back({"ln_f.bias", {E}});
}

// "h.3.attn.bias" / "h.3.attn.masked_bias": GPT-2's stored causal masks.
bool is_gpt2_buffer(const std::string& name) {
    if (name.rfind("h.", 0) != 0) return false;
    auto ends_with = [&](const char* s) {
        std::string suffix(s);
        return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    return ends_with(".attn.bias") || ends_with(".attn.masked_bias");
}

std::string dtype_text(DType t) {
    return t < DType::COUNT ? st_dtype_name(st_dtype_from_kv(t)) : "?";
}

void append_list(std::string& out, const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    out += str(out.empty() ? "" : "; ", items.size(), " ", title, ": ");
    const size_t shown = std::min<size_t>(items.size(), 10);
    for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + items[i];
    if (items.size() > shown) out += str(" ... and ", items.size() - shown, " more");
}

}  // namespace

std::vector<WeightSpec> expected_weight_shapes(const ModelConfig& cfg) {
    std::vector<WeightSpec> w;
    if (cfg.arch == Arch::GPT2)
        gpt2(cfg, w);
    else
        llama_family(cfg, w);
    w.push_back({"lm_head.weight", {cfg.vocab_size, cfg.hidden_size}, cfg.tie_word_embeddings});
    return w;
}

std::string WeightCheck::report() const {
    std::string out;
    append_list(out, "missing", missing);
    append_list(out, "with the wrong shape", misshaped);
    append_list(out, "with a non-float dtype", bad_dtype);
    append_list(out, "unexpected", unexpected);
    return out;
}

WeightCheck check_weights(const ModelConfig& cfg, const TensorMap& weights) {
    WeightCheck r;
    std::set<std::string> known;
    for (const WeightSpec& s : expected_weight_shapes(cfg)) {
        known.insert(s.name);
        auto it = weights.find(s.name);
        if (it == weights.end() || !it->second.defined()) {
            if (!s.optional) r.missing.push_back(str(s.name, " (expected ", s.shape.str(), ")"));
            continue;
        }
        const Tensor& t = it->second;
        if (t.shape() != s.shape) r.misshaped.push_back(str(s.name, ": expected ", s.shape.str(), ", got ", t.shape().str()));
        if (!dtype_is_float(t.dtype())) r.bad_dtype.push_back(str(s.name, ": dtype ", dtype_text(t.dtype()), ", expected F32, F16, BF16 or F64"));
    }
    for (const auto& [name, t] : weights) {
        if (known.count(name)) continue;
        if (cfg.arch == Arch::GPT2 && is_gpt2_buffer(name)) continue;
        r.unexpected.push_back(name);
    }
    return r;
}

void require_weights(const ModelConfig& cfg, const TensorMap& weights, const std::string& source) {
    WeightCheck r = check_weights(cfg, weights);
    if (!r.ok())
        throw Error(str(source, ": weights do not match the ", arch_name(cfg.arch), " config (", cfg.num_layers, " layers, hidden ",
                        cfg.hidden_size, ", heads ", cfg.num_heads, "/", cfg.num_kv_heads, ", head_dim ", cfg.head_dim,
                        "): ", r.report()));
}

}  // namespace kv
