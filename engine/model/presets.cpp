// Preset configs and deterministic random weights (see presets.h).
#include "presets.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace kv {

namespace {
ModelConfig base(const std::string& name, Arch arch, int64_t vocab, int64_t hidden, int64_t inter, int64_t layers, int64_t heads,
                 int64_t kv_heads, int64_t head_dim, int64_t max_pos, double theta) {
    ModelConfig c;
    c.arch = arch;
    c.model_type = arch_name(arch);
    c.name = name;
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.intermediate_size = inter;
    c.num_layers = layers;
    c.num_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.max_position_embeddings = max_pos;
    c.rope_theta = theta;
    return c;
}

struct Entry {
    PresetInfo info;
    std::function<ModelConfig()> make;
};

const std::vector<Entry>& entries() {
    static const std::vector<Entry> e = {
        {{"tiny", "2 layers, width 64, 4 heads / 2 KV heads, byte vocabulary — runs in milliseconds"},
         [] {
             ModelConfig c = base("tiny", Arch::LLAMA, kByteVocab, 64, 128, 2, 4, 2, 16, 2048, 10000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             return c;
         }},
        {{"small", "6 layers, width 256, 8 heads / 2 KV heads, byte vocabulary"},
         [] {
             ModelConfig c = base("small", Arch::LLAMA, kByteVocab, 256, 704, 6, 8, 2, 32, 8192, 10000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             return c;
         }},
        {{"tiny-gemma3", "Gemma 3 layout in miniature: 6 layers (sliding window 64 in 4, full in 2), width 64, 4 heads / 1 KV head, byte vocabulary"},
         [] {
             ModelConfig c = base("tiny-gemma3", Arch::GEMMA3, kByteVocab, 64, 128, 6, 4, 1, 16, 2048, 1000000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             c.norm_placement = NormPlacement::BOTH;
             c.norm_weight_offset = 1.0;
             c.embedding_scale = std::sqrt(64.0);
             c.qk_norm = true;
             c.query_pre_attn_scalar = 16;
             c.mlp_act = MlpAct::GELU_TANH;
             c.tie_word_embeddings = true;
             c.layer_specs.resize(6);
             for (int64_t l = 0; l < 6; ++l) {  // Gemma3TextConfig's rule with sliding_window_pattern 3
                 LayerSpec& s = c.layer_specs[size_t(l)];
                 const bool sliding = (l + 1) % 3 != 0;
                 s.rope_theta = sliding ? 10000.0 : 1000000.0;
                 s.rope_scaled = !sliding;
                 if (sliding) s.attention = AttnKind::SLIDING, s.window = 64;
             }
             return c;
         }},
        {{"tiny-gpt-oss", "gpt-oss in miniature: 4 layers (sliding window 64, full, sliding, full), learned attention sinks, "
          "q/k/v/o biases, width 64, 4 heads / 2 KV heads, a mixture of 4 experts (clamped SwiGLU of width 64, 2 per token), "
          "byte vocabulary"},
         [] {
             ModelConfig c = base("tiny-gpt-oss", Arch::GPT_OSS, kByteVocab, 64, 64, 4, 4, 2, 16, 2048, 150000.0);
             c.moe.num_experts = 4;
             c.moe.top_k = 2;
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             c.attention_sinks = true;
             c.qkv_bias = c.o_bias = true;
             c.rms_norm_eps = 1e-5;
             c.layer_specs.resize(4);
             for (int64_t l = 0; l < 4; ++l) {  // GptOssConfig's layer_types: sliding, full, ...
                 LayerSpec& s = c.layer_specs[size_t(l)];
                 s.rope_theta = c.rope_theta;
                 if (l % 2 == 0) s.attention = AttnKind::SLIDING, s.window = 64;
                 s.mlp = MlpKind::EXPERTS;
             }
             return c;
         }},
        {{"tiny-mla", "DeepSeek-V2 latent attention in miniature: 4 layers, width 64, 4 heads with keys of 16 + 8 rotated channels "
          "decompressed from a latent of 32, values of 16, query latent 48, dense SwiGLU MLP, byte vocabulary"},
         [] {
             ModelConfig c = base("tiny-mla", Arch::DEEPSEEK_V2, kByteVocab, 64, 128, 4, 4, 4, 24, 2048, 10000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             c.attn_projection = AttnProjection::LATENT;
             c.latent.q_lora_rank = 48;
             c.latent.kv_lora_rank = 32;
             c.latent.qk_nope_head_dim = 16;
             c.latent.qk_rope_head_dim = 8;
             c.latent.v_head_dim = 16;
             c.partial_rotary_factor = 8.0 / 24.0;
             return c;
         }},
        {{"tiny-lfm2", "LFM2's hybrid in miniature: 6 layers (gated short convolutions of width 3 in 0, 1, 3, 4; attention with q/k "
          "norm in 2 and 5), width 64, 4 heads / 2 KV heads, SwiGLU MLP, tied, byte vocabulary"},
         [] {
             ModelConfig c = base("tiny-lfm2", Arch::LFM2, kByteVocab, 64, 128, 6, 4, 2, 16, 2048, 1000000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             c.qk_norm = true;
             c.tie_word_embeddings = true;
             c.rms_norm_eps = 1e-5;
             c.conv_kernel = 3;
             c.layer_specs.resize(6);
             for (int64_t l = 0; l < 6; ++l) {  // LFM2-350M's pattern (attention every third layer at first) cut to 6
                 LayerSpec& s = c.layer_specs[size_t(l)];
                 s.rope_theta = c.rope_theta;
                 if (l % 3 != 2) s.mixer = LayerMixer::SHORT_CONV, s.attention = AttnKind::NONE;
             }
             return c;
         }},
        {{"tiny-gemma3n", "Gemma 3n's text decoder in miniature: 6 layers (sliding window 64 in 4, full in 2; 4 and 5 read the K/V "
          "of 3 and 2), AltUp over 4 streams, LAUREL of rank 4, per-layer inputs of 8, the gaussian top-k gate (0.95) in 0 and 1, "
          "width 64, 4 heads / 2 KV heads, byte vocabulary"},
         [] {
             ModelConfig c = base("tiny-gemma3n", Arch::GEMMA3N, kByteVocab, 64, 128, 6, 4, 2, 16, 2048, 1000000.0);
             c.bos_token_id = kByteBos;
             c.eos_token_ids = {kByteEos};
             c.pad_token_id = kBytePad;
             c.norm_placement = NormPlacement::BOTH;
             c.embedding_scale = std::sqrt(64.0);
             c.qk_norm = c.v_norm = true;
             c.query_pre_attn_scalar = 1.0;  // Gemma3nTextAttention's scaling 1.0
             c.final_logit_softcap = 30.0;
             c.mlp_act = MlpAct::GELU_TANH;
             c.tie_word_embeddings = true;
             c.rms_norm_eps = 1e-6;
             c.altup.num_inputs = 4;
             c.altup.coef_clip = 120.0;
             c.altup.correct_scale = true;
             c.altup.laurel_rank = 4;
             c.altup.per_layer_dim = 8;
             c.altup.per_layer_vocab = kByteVocab;
             c.layer_specs.resize(6);
             for (int64_t l = 0; l < 6; ++l) {  // Gemma 3n's rules (layer types, sparsity in the first third, the last third shared) cut to 6
                 LayerSpec& s = c.layer_specs[size_t(l)];
                 const bool sliding = (l + 1) % 3 != 0;
                 s.rope_theta = sliding ? 10000.0 : 1000000.0;
                 s.rope_scaled = !sliding;
                 if (sliding) s.attention = AttnKind::SLIDING, s.window = 64;
                 s.activation_sparsity = l < 2 ? 0.95 : 0.0;
                 if (l >= 4) s.kv_source = sliding ? 3 : 2;
             }
             return c;
         }},
        {{"qwen2.5-0.5b", "Qwen2.5-0.5B shapes (24 layers, width 896, 14/2 heads, q/k/v bias, tied), random weights"},
         [] {
             ModelConfig c = base("qwen2.5-0.5b", Arch::QWEN2, 151936, 896, 4864, 24, 14, 2, 64, 32768, 1000000.0);
             c.qkv_bias = true;
             c.tie_word_embeddings = true;
             c.bos_token_id = 151643;
             c.eos_token_ids = {151645, 151643};
             return c;
         }},
        {{"qwen3-0.6b", "Qwen3-0.6B shapes (28 layers, width 1024, 16/8 heads of 128, q/k norm, tied), random weights"},
         [] {
             ModelConfig c = base("qwen3-0.6b", Arch::QWEN3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1000000.0);
             c.qk_norm = true;
             c.tie_word_embeddings = true;
             c.eos_token_ids = {151645};
             return c;
         }},
        {{"llama-3.2-1b", "Llama-3.2-1B shapes (16 layers, width 2048, 32/8 heads, llama3 rope scaling, tied), random weights"},
         [] {
             ModelConfig c = base("llama-3.2-1b", Arch::LLAMA, 128256, 2048, 8192, 16, 32, 8, 64, 131072, 500000.0);
             c.tie_word_embeddings = true;
             c.rope_scaling.type = "llama3";
             c.rope_scaling.factor = 32.0;
             c.rope_scaling.low_freq_factor = 1.0;
             c.rope_scaling.high_freq_factor = 4.0;
             c.rope_scaling.original_max_position_embeddings = 8192;
             c.rms_norm_eps = 1e-5;
             c.bos_token_id = 128000;
             c.eos_token_ids = {128001, 128008, 128009};
             return c;
         }},
    };
    return e;
}

// splitmix64: a tiny, well-mixed generator for reproducible per-tensor streams.
inline uint64_t splitmix(uint64_t& s) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

Tensor uniform_tensor(const Shape& shape, uint64_t seed, float center, float half_width, DType dtype, Device device,
                      const std::string& name) {
    Tensor t = Tensor::empty(shape, DType::F32, {Device{}, MemCategory::WEIGHTS, name});
    float* p = t.data<float>();
    const int64_t n = t.numel(), block = 1 << 16;
#pragma omp parallel for schedule(static)
    for (int64_t b0 = 0; b0 < n; b0 += block) {
        uint64_t s = seed ^ (uint64_t(b0) * 0xd6e8feb86659fd93ull);
        for (int64_t i = b0; i < std::min(n, b0 + block); ++i) {
            double u = double(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
            p[i] = center + half_width * float(2.0 * u - 1.0);
        }
    }
    if (dtype == DType::F32 && device.is_cpu()) return t;
    Tensor out = Tensor::empty(shape, dtype, {device, MemCategory::WEIGHTS, name});
    out.copy_from(t);
    return out;
}
}  // namespace

std::vector<PresetInfo> list_presets() {
    std::vector<PresetInfo> v;
    for (const auto& e : entries()) v.push_back(e.info);
    return v;
}

bool is_preset(const std::string& name) {
    for (const auto& e : entries())
        if (e.info.name == name) return true;
    return false;
}

ModelConfig preset_config(const std::string& name) {
    for (const auto& e : entries())
        if (e.info.name == name) {
            ModelConfig c = e.make();
            c.validate("preset " + name);
            return c;
        }
    std::string all;
    for (const auto& e : entries()) all += (all.empty() ? "" : ", ") + e.info.name;
    throw Error(str("unknown model '", name, "'; expected a preset (", all, ") or a model folder"));
}

TensorMap random_weights(const ModelConfig& c, uint64_t seed, DType dtype, Device device) {
    TensorMap w;
    const float a = 0.02f * std::sqrt(3.0f);  // uniform half-width with std 0.02
    auto lin = [&](const std::string& name, const Shape& s) {
        w[name] = uniform_tensor(s, seed ^ std::hash<std::string>{}(name), 0.0f, a, dtype, device, name);
    };
    auto norm = [&](const std::string& name, int64_t n) {
        // Around 1 (not exactly 1) so tests see the weight multiply.
        w[name] = uniform_tensor({n}, seed ^ std::hash<std::string>{}(name), 1.0f, 0.1f, dtype, device, name);
    };
    const int64_t E = c.hidden_size, I = c.intermediate_size, Q = c.q_dim(), K = c.kv_dim();
    lin("model.embed_tokens.weight", {c.vocab_size, E});
    for (int64_t l = 0; l < c.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        if (c.norm_placement != NormPlacement::POST) norm(p + "input_layernorm.weight", E);
        if (c.norm_placement == NormPlacement::BOTH) norm(p + "pre_feedforward_layernorm.weight", E);
        if (c.norm_placement != NormPlacement::PRE) norm(p + "post_feedforward_layernorm.weight", E);
        if (c.short_conv_layer(l)) {
            lin(p + "conv.in_proj.weight", {3 * E, E});
            // taps of order 1: each output mixes its last conv_kernel inputs in earnest
            w[p + "conv.conv.weight"] = uniform_tensor({E, 1, c.conv_kernel}, seed ^ std::hash<std::string>{}(p + "conv.conv.weight"), 0.0f,
                                                       1.0f, dtype, device, p + "conv.conv.weight");
            lin(p + "conv.out_proj.weight", {E, E});
        } else if (c.latent_attention()) {
            const LatentAttention& la = c.latent;
            if (la.q_lora_rank > 0) {
                lin(p + "self_attn.q_a_proj.weight", {la.q_lora_rank, E});
                norm(p + "self_attn.q_a_layernorm.weight", la.q_lora_rank);
                lin(p + "self_attn.q_b_proj.weight", {Q, la.q_lora_rank});
            } else {
                lin(p + "self_attn.q_proj.weight", {Q, E});
            }
            lin(p + "self_attn.kv_a_proj_with_mqa.weight", {la.kv_lora_rank + la.qk_rope_head_dim, E});
            norm(p + "self_attn.kv_a_layernorm.weight", la.kv_lora_rank);
            lin(p + "self_attn.kv_b_proj.weight", {c.num_heads * (la.qk_nope_head_dim + la.v_head_dim), la.kv_lora_rank});
        } else if (c.fused_projections) {
            lin(p + "self_attn.qkv_proj.weight", {Q + 2 * K, E});
        } else {
            lin(p + "self_attn.q_proj.weight", {Q, E});
            lin(p + "self_attn.k_proj.weight", {K, E});
            lin(p + "self_attn.v_proj.weight", {K, E});
        }
        if (c.qkv_bias) {
            lin(p + "self_attn.q_proj.bias", {Q});
            lin(p + "self_attn.k_proj.bias", {K});
            lin(p + "self_attn.v_proj.bias", {K});
        }
        if (c.qk_norm && !c.short_conv_layer(l)) {
            norm(p + "self_attn.q_norm.weight", c.qk_norm_whole ? Q : c.head_dim);
            norm(p + "self_attn.k_norm.weight", c.qk_norm_whole ? K : c.head_dim);
        }
        if (!c.short_conv_layer(l)) lin(p + "self_attn.o_proj.weight", {E, c.num_heads * c.v_head_dim()});
        if (c.o_bias) lin(p + "self_attn.o_proj.bias", {E});
        // Sink logits in [0, 2]: against the near-zero scores of these weights they take a real
        // share of each row (gpt-oss's trained sinks are of the scores' size).
        if (c.attention_sinks)
            w[p + "self_attn.sinks"] = uniform_tensor({c.num_heads}, seed ^ std::hash<std::string>{}(p + "self_attn.sinks"), 1.0f, 1.0f,
                                                      dtype, device, p + "self_attn.sinks");
        norm(p + "post_attention_layernorm.weight", E);
        if (c.altup_enabled()) {  // Gemma 3n: LAUREL, the AltUp router and coefficients, the per-layer input's gate
            const int64_t A = c.altup.num_inputs, P = c.altup.per_layer_dim, R = c.altup.laurel_rank;
            lin(p + "laurel.linear_left.weight", {R, E});
            lin(p + "laurel.linear_right.weight", {E, R});
            norm(p + "laurel.post_laurel_norm.weight", E);
            norm(p + "altup.router_norm.weight", E);
            lin(p + "altup.modality_router.weight", {A, E});
            lin(p + "altup.prediction_coefs.weight", {A * A, A});
            lin(p + "altup.correction_coefs.weight", {A, A});
            norm(p + "altup.correct_output_scale", E);
            lin(p + "per_layer_input_gate.weight", {P, E});
            lin(p + "per_layer_projection.weight", {E, P});
            norm(p + "post_per_layer_input_norm.weight", E);
        }
        if (c.experts_layer(l)) {
            const int64_t N = c.moe.num_experts;
            // Router weights of order 1: the top-k choice is decided by clear margins, not by
            // differences of a few ulps between near-equal logits.
            w[p + "mlp.router.weight"] = uniform_tensor({N, E}, seed ^ std::hash<std::string>{}(p + "mlp.router.weight"), 0.0f, 1.0f,
                                                        dtype, device, p + "mlp.router.weight");
            lin(p + "mlp.router.bias", {N});
            lin(p + "mlp.experts.gate_up_proj", {N, E, 2 * I});
            lin(p + "mlp.experts.gate_up_proj_bias", {N, 2 * I});
            lin(p + "mlp.experts.down_proj", {N, I, E});
            lin(p + "mlp.experts.down_proj_bias", {N, E});
            continue;
        }
        if (c.fused_projections) {
            lin(p + "mlp.gate_up_proj.weight", {2 * I, E});
        } else {
            lin(p + "mlp.gate_proj.weight", {I, E});
            lin(p + "mlp.up_proj.weight", {I, E});
        }
        lin(p + "mlp.down_proj.weight", {E, I});
    }
    if (c.altup_enabled()) {
        const int64_t A = c.altup.num_inputs, P = c.altup.per_layer_dim;
        lin("model.embed_tokens_per_layer.weight", {c.altup.per_layer_vocab, c.num_layers * P});
        lin("model.per_layer_model_projection.weight", {c.num_layers * P, E});
        norm("model.per_layer_projection_norm.weight", P);
        for (int64_t i = 1; i < A; ++i) {
            lin(str("model.altup_projections.", i - 1, ".weight"), {E, E});
            lin(str("model.altup_unembed_projections.", i - 1, ".weight"), {E, E});
        }
    }
    norm("model.norm.weight", E);
    if (!c.tie_word_embeddings) lin("lm_head.weight", {c.vocab_size, E});
    return w;
}

}  // namespace kv
