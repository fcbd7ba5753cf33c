// The architecture description every loader produces and the forward pass consumes.
// Loaders (config.json, GGUF metadata, presets) fill it; validate() rejects impossible
// combinations with one message naming the field. Header-only, and in core/ rather than model/,
// so the loaders (io/, gguf/) and the model share it without a folder cycle (model_loader.cpp
// includes the loaders; the loaders must not include model/).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace kv {

enum class Arch : uint8_t { LLAMA, MISTRAL, QWEN2, QWEN3, GPT2, GEMMA2, GEMMA3, SMOLLM3, PHI3, OLMO2, GPT_OSS, DEEPSEEK_V2, LFM2, GEMMA3N };

inline const char* arch_name(Arch a) {
    switch (a) {
        case Arch::LLAMA: return "llama";
        case Arch::MISTRAL: return "mistral";
        case Arch::QWEN2: return "qwen2";
        case Arch::QWEN3: return "qwen3";
        case Arch::GPT2: return "gpt2";
        case Arch::GEMMA2: return "gemma2";
        case Arch::GEMMA3: return "gemma3_text";
        case Arch::SMOLLM3: return "smollm3";
        case Arch::PHI3: return "phi3";
        case Arch::OLMO2: return "olmo2";
        case Arch::GPT_OSS: return "gpt_oss";
        case Arch::DEEPSEEK_V2: return "deepseek_v2";
        case Arch::LFM2: return "lfm2";
        case Arch::GEMMA3N: return "gemma3n_text";
    }
    return "?";
}

// Hugging Face `rope_scaling` (Llama 3.1+ "llama3", "linear", "yarn", ...); type "" = none.
struct RopeScaling {
    std::string type;
    double factor = 1.0;
    double low_freq_factor = 1.0;
    double high_freq_factor = 4.0;
    int64_t original_max_position_embeddings = 0;
    // "longrope" (Phi-3 / Phi-4-mini; transformers' _compute_longrope_parameters): rotated pair d
    // turns at inv_freq_d / factor_d, with the short factors while the context is at most
    // original_max_position_embeddings and the long ones beyond it, and q and k are multiplied
    // by attention_factor (0: sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings /
    // original, 1 when s <= 1).
    std::vector<double> short_factor, long_factor;
    double attention_factor = 0.0;
};

// How a layer attends (transformers' layer_types): every earlier key, a sliding window of
// them, or not at all (a layer whose mixer is not attention: LayerMixer).
enum class AttnKind : uint8_t { GLOBAL, SLIDING, NONE };

inline const char* attn_kind_name(AttnKind k) {
    switch (k) {
        case AttnKind::GLOBAL: return "global";
        case AttnKind::SLIDING: return "sliding";
        case AttnKind::NONE: return "none";
    }
    return "?";
}

// What mixes tokens in a layer: attention (keys and values in the KV cache), or LFM2's gated
// short convolution (engine/model/short_conv.h), a causal depthwise convolution over the last
// ModelConfig::conv_kernel tokens whose only memory is a state of conv_kernel - 1 inputs per
// channel, not a token cache. A SHORT_CONV layer's attention is AttnKind::NONE.
enum class LayerMixer : uint8_t { ATTENTION, SHORT_CONV };

inline const char* layer_mixer_name(LayerMixer m) { return m == LayerMixer::SHORT_CONV ? "short_conv" : "attention"; }

// Where a block's RMSNorms sit: before attention and MLP (Llama), after them on their outputs
// before the residual add (OLMo 2), or both (Gemma 2/3: four norms per block).
enum class NormPlacement : uint8_t { PRE, POST, BOTH };

// The gated MLP's activation: down(act(gate x) * up x).
enum class MlpAct : uint8_t { SILU, GELU_TANH };

// What a layer's MLP is: one gated MLP (MlpAct), or a mixture of gated experts
// (MixtureOfExperts, gpt-oss; engine/model/moe_mlp.h).
enum class MlpKind : uint8_t { GATED, EXPERTS };

inline const char* mlp_kind_name(MlpKind k) { return k == MlpKind::EXPERTS ? "experts" : "gated"; }

// gpt-oss's mixture of experts (transformers' GptOssMLP): a router (linear with bias) scores
// num_experts experts per token; the top_k best are run and their outputs summed with weights
// softmax(the top_k router logits). Each expert is a clamped SwiGLU of width intermediate_size
// with biases: g = min(gate, limit), u = clamp(up, -limit, limit), down((u + 1) g sigmoid(alpha g)).
struct MixtureOfExperts {
    int64_t num_experts = 0;  // num_local_experts
    int64_t top_k = 0;        // num_experts_per_tok
    double limit = 7.0;       // GptOssExperts.limit
    double alpha = 1.702;     // GptOssExperts.alpha
};

// One layer's attention and position encoding. Loaders fill ModelConfig::layer_specs for
// families whose layers differ (Gemma, SmolLM3); others leave it empty and layer_spec()
// derives it from sliding_window / window_from_layer.
struct LayerSpec {
    AttnKind attention = AttnKind::GLOBAL;
    int64_t window = 0;           // SLIDING: a query at p sees keys at positions > p - window
    double rope_theta = 10000.0;  // RoPE base of this layer
    double rotary_fraction = 1.0; // rotated fraction of head_dim; 0 = NoPE (no rotation)
    bool rope_scaled = true;      // whether the model's rope_scaling applies (Gemma 3: global layers only)
    LayerMixer mixer = LayerMixer::ATTENTION;
    // Cross-layer KV sharing (Gemma 3n's num_kv_shared_layers): >= 0 names an earlier layer of
    // the same attention type whose cached keys and values this layer reads with its own
    // queries; it computes and caches none of its own. -1: the layer has its own K/V.
    int64_t kv_source = -1;
    // Gemma 3n's activation sparsity (activation_sparsity_pattern): > 0 passes the MLP gate
    // through a gaussian top-k, relu(g - mean(g) - std(g) * Phi^-1(sparsity)) per token.
    double activation_sparsity = 0.0;
    MlpKind mlp = MlpKind::GATED;  // EXPERTS: ModelConfig::moe describes the experts
};

// Gemma 3n's residual stream (engine/model/altup.h): AltUp keeps num_inputs copies of the hidden
// state and a layer computes on one (active_idx) after a learned prediction, then corrects the
// others; LAUREL adds a low-rank residual beside attention; per-layer inputs (a P-wide embedding
// per token and layer) enter every layer's output. Between blocks the hidden state is packed as
// (B, n, num_inputs * E + num_layers * P): the streams, then the per-layer inputs.
struct AltUpSpec {
    int64_t num_inputs = 0;         // altup_num_inputs; 0 = no AltUp (one residual stream)
    int64_t active_idx = 0;         // altup_active_idx
    double coef_clip = 0.0;         // altup_coef_clip: correction coefficients clamped to [-c, c] (0 = none)
    bool correct_scale = true;      // altup_correct_scale: correct_output_scale multiplies the active stream
    int64_t laurel_rank = 0;        // LAUREL's rank
    int64_t per_layer_dim = 0;      // hidden_size_per_layer_input (P)
    int64_t per_layer_vocab = 0;    // vocab_size_per_layer_input
};

// How a layer projects its queries, keys and values. SEPARATE: q/k/v projections (or Phi-3's
// fused one) of head_dim each. LATENT: multi-head latent attention (DeepSeek-V2, MiniCPM3): the
// keys and values of every head are decompressed from one latent c_kv = RMSNorm(W_kv_a x)
// of kv_lora_rank values, beside one RoPE key k_pe of qk_rope_head_dim shared by the heads.
enum class AttnProjection : uint8_t { SEPARATE, LATENT };

// The latent attention's sizes (config.json's names). head_dim is the query/key head,
// qk_nope_head_dim + qk_rope_head_dim; values are v_head_dim <= head_dim.
struct LatentAttention {
    int64_t q_lora_rank = 0;       // 0: q_proj straight from the hidden state; else q_a_proj, its norm, q_b_proj
    int64_t kv_lora_rank = 0;      // latent width
    int64_t qk_nope_head_dim = 0;  // per-head key channels from the latent
    int64_t qk_rope_head_dim = 0;  // rotated channels (k_pe shared by the heads)
    int64_t v_head_dim = 0;        // per-head value channels
    double latent_norm_eps = 1e-6;  // q_a_layernorm / kv_a_layernorm: transformers builds them with the default eps
    // What the KV cache of a latent layer holds (--model.mla_cache). LATENT: per token the latent
    // and k_pe, one vector [k_pe ; c_kv] of qk_rope_head_dim + kv_lora_rank values shared by the
    // heads (one KV head, values = keys), W_kv_b absorbed into the queries and applied after the
    // weighted sum (DeepSeek-V2's inference). EXPANDED: every head's decompressed K and V
    // (head_dim each); the form gradients run through.
    enum class Cache : uint8_t { LATENT, EXPANDED };
    Cache cache = Cache::LATENT;
    // How a chunk over a latent cache is computed (engine/model/latent_expansion.h): AUTO the
    // form with fewer multiply-adds (absorbed for decode, expanded for long chunks); ABSORBED or
    // EXPANDED for every chunk (tests compare the two). Not read from config.json.
    enum class ChunkForm : uint8_t { AUTO, ABSORBED, EXPANDED };
    ChunkForm chunk_form = ChunkForm::AUTO;
};

struct ModelConfig {
    Arch arch = Arch::LLAMA;
    std::string model_type;  // as in config.json ("llama", "qwen2", ...)
    std::string name;        // preset or folder name, for display

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;        // E (C)
    int64_t intermediate_size = 0;  // MLP width
    int64_t num_layers = 0;
    int64_t num_heads = 0;          // NH (query heads)
    int64_t num_kv_heads = 0;       // G
    int64_t head_dim = 0;           // HS (D); explicit for Qwen3, else hidden / heads
    int64_t max_position_embeddings = 0;  // training context (block size for YaRN)

    double rms_norm_eps = 1e-6;
    double rope_theta = 10000.0;
    double partial_rotary_factor = 1.0;   // rotated fraction of head_dim
    RopeScaling rope_scaling;

    bool tie_word_embeddings = false;
    bool qkv_bias = false;       // Qwen2/2.5
    bool o_bias = false;
    bool mlp_bias = false;
    bool qk_norm = false;        // Qwen3: per-head RMSNorm on q and k before RoPE
    bool qk_norm_whole = false;  // OLMo 2: that norm spans the whole projection (all heads at once)
    bool fused_projections = false;  // Phi-3: checkpoints store qkv_proj and gate_up_proj fused
    int64_t sliding_window = 0;     // 0 = none; else keys older than the window are masked
    int64_t window_from_layer = 0;  // first windowed layer: layers >= it use sliding_window
                                    // (Qwen2/3's max_window_layers; 0 for Mistral = all layers)

    // Per-layer attention and RoPE (size num_layers), or empty: every layer as layer_spec() derives.
    std::vector<LayerSpec> layer_specs;
    NormPlacement norm_placement = NormPlacement::PRE;
    double norm_weight_offset = 0.0;    // RMSNorm multiplies by (offset + w): Gemma stores w - 1
    double attn_logit_softcap = 0.0;    // > 0: scores s -> cap tanh(s / cap) before the softmax (Gemma 2)
    double final_logit_softcap = 0.0;   // > 0: logits z -> cap tanh(z / cap) (Gemma 2)
    double query_pre_attn_scalar = 0.0; // > 0: scores scaled by 1/sqrt(this) instead of 1/sqrt(head_dim)
    double embedding_scale = 1.0;       // embeddings multiplied by this (Gemma: sqrt(hidden_size))
    bool attention_sinks = false;       // a learned logit per head joins every softmax denominator (gpt-oss)
    MlpAct mlp_act = MlpAct::SILU;
    AttnProjection attn_projection = AttnProjection::SEPARATE;
    LatentAttention latent;             // attn_projection LATENT: its sizes
    int64_t conv_kernel = 0;            // SHORT_CONV layers: the convolution's width (LFM2's conv_L_cache)
    MixtureOfExperts moe;               // layers whose LayerSpec::mlp is EXPERTS: the experts (each of intermediate_size)
    bool v_norm = false;                // values through an RMSNorm without weight (Gemma 3n)
    AltUpSpec altup;                    // Gemma 3n's streams, LAUREL and per-layer inputs (num_inputs 0: none)

    int64_t bos_token_id = -1;
    std::vector<int64_t> eos_token_ids;
    int64_t pad_token_id = -1;

    DType dtype = DType::F32;  // storage dtype of the checkpoint ("torch_dtype")

    int64_t q_dim() const { return num_heads * head_dim; }
    int64_t kv_dim() const { return num_kv_heads * head_dim; }
    int64_t rope_dims() const { return int64_t(double(head_dim) * partial_rotary_factor) / 2 * 2; }
    int64_t group_size() const { return num_kv_heads ? num_heads / num_kv_heads : 0; }  // R
    bool latent_attention() const { return attn_projection == AttnProjection::LATENT; }
    bool altup_enabled() const { return altup.num_inputs > 0; }
    // Width of the hidden state between blocks: E, or Gemma 3n's packed streams and per-layer inputs.
    int64_t residual_width() const {
        return altup_enabled() ? altup.num_inputs * hidden_size + num_layers * altup.per_layer_dim : hidden_size;
    }
    // The KV cache's geometry, the same for every layer that has one: a latent cache
    // (LatentAttention::Cache::LATENT) is one KV head of qk_rope_head_dim + kv_lora_rank channels
    // whose values are its keys (one stored vector per token), else G heads of head_dim, K and V.
    bool latent_cache() const { return latent_attention() && latent.cache == LatentAttention::Cache::LATENT; }
    int64_t cache_kv_heads() const { return latent_cache() ? 1 : num_kv_heads; }
    int64_t cache_head_dim() const { return latent_cache() ? latent.qk_rope_head_dim + latent.kv_lora_rank : head_dim; }
    int64_t cache_tensors() const { return latent_cache() ? 1 : 2; }  // stored vectors per token and KV head
    // Value channels per head (the cache holds values padded to head_dim with zeros).
    int64_t v_head_dim() const { return latent_attention() ? latent.v_head_dim : head_dim; }
    // Layer l's attention window for ops::sdpa_ (0 = full causal attention). transformers'
    // Qwen2Config builds layer_types as "sliding_attention" iff sliding_window is set and
    // i >= max_window_layers; Mistral windows every layer.
    // An explicit layer_specs entry wins.
    LayerSpec layer_spec(int64_t l) const {
        if (!layer_specs.empty()) return layer_specs[size_t(l)];
        LayerSpec s;
        s.rope_theta = rope_theta;
        s.rotary_fraction = partial_rotary_factor;
        if (sliding_window > 0 && l >= window_from_layer) s.attention = AttnKind::SLIDING, s.window = sliding_window;
        return s;
    }
    bool short_conv_layer(int64_t l) const { return layer_spec(l).mixer == LayerMixer::SHORT_CONV; }
    bool experts_layer(int64_t l) const { return layer_spec(l).mlp == MlpKind::EXPERTS; }
    bool has_experts() const {
        for (int64_t l = 0; l < num_layers; ++l)
            if (experts_layer(l)) return true;
        return false;
    }
    // Whether layer l keeps keys and values in the KV cache (every layer but a short convolution).
    bool has_kv_cache(int64_t l) const { return !short_conv_layer(l); }
    // The layer whose cache layer l attends over: l itself, or its KV-sharing source.
    int64_t kv_layer(int64_t l) const {
        const int64_t s = layer_spec(l).kv_source;
        return s >= 0 ? s : l;
    }
    bool kv_shared(int64_t l) const { return layer_spec(l).kv_source >= 0; }
    bool any_kv_shared() const {
        for (int64_t l = 0; l < num_layers; ++l)
            if (kv_shared(l)) return true;
        return false;
    }
    int layer_window(int64_t l) const {
        const LayerSpec s = layer_spec(l);
        return s.attention == AttnKind::SLIDING ? int(s.window) : 0;
    }
    // Rotated channels of layer l (0 for a NoPE layer).
    int64_t layer_rope_dims(int64_t l) const { return int64_t(double(head_dim) * layer_spec(l).rotary_fraction) / 2 * 2; }
    // The multiplier of q.k before any context-extension factor.
    double query_scale() const { return 1.0 / std::sqrt(query_pre_attn_scalar > 0 ? query_pre_attn_scalar : double(head_dim)); }

    // Throws kv::Error naming the field and what was expected.
    void validate(const std::string& source) const {
        auto need = [&](bool ok, const std::string& msg) {
            if (!ok) throw Error(str(source, ": ", msg));
        };
        need(vocab_size > 0, str("vocab_size must be > 0, got ", vocab_size));
        need(hidden_size > 0, str("hidden_size must be > 0, got ", hidden_size));
        need(intermediate_size > 0, str("intermediate_size must be > 0, got ", intermediate_size));
        need(num_layers > 0, str("num_hidden_layers must be > 0, got ", num_layers));
        need(num_heads > 0, str("num_attention_heads must be > 0, got ", num_heads));
        need(num_kv_heads > 0 && num_heads % num_kv_heads == 0,
             str("num_key_value_heads (", num_kv_heads, ") must divide num_attention_heads (", num_heads, ")"));
        need(head_dim > 0 && head_dim % 2 == 0, str("head_dim must be a positive even number, got ", head_dim));
        need(rope_dims() > 0, str("partial_rotary_factor ", partial_rotary_factor, " leaves no rotated channels"));
        need(rms_norm_eps >= 0, str("rms_norm_eps must be >= 0, got ", rms_norm_eps));
        need(rope_theta > 0, str("rope_theta must be > 0, got ", rope_theta));
        need(max_position_embeddings > 0, str("max_position_embeddings must be > 0, got ", max_position_embeddings));
        // Plausible ranges: values outside them come from a corrupt or mis-converted file and
        // would run without complaint (rms_norm_eps 1e30 flattens every activation).
        need(std::isfinite(rms_norm_eps) && rms_norm_eps <= 0.1,
             str("rms_norm_eps ", rms_norm_eps, " is implausible; expected a small value in [0, 0.1] (typically 1e-5)"));
        need(std::isfinite(rope_theta) && rope_theta >= 1 && rope_theta <= 1e10,
             str("rope_theta ", rope_theta, " is implausible; expected [1, 1e10] (typically 1e4 .. 1e6)"));
        need(head_dim <= 1024, str("head_dim ", head_dim, " is implausible; expected at most 1024"));
        need(hidden_size <= (int64_t(1) << 17), str("hidden_size ", hidden_size, " is implausible; expected at most 131072"));
        need(num_layers <= 1024, str("num_hidden_layers ", num_layers, " is implausible; expected at most 1024"));
        need(vocab_size <= (int64_t(1) << 24), str("vocab_size ", vocab_size, " is implausible; expected at most 2^24"));
        // ops::sdpa_ takes the window as an int.
        need(sliding_window >= 0 && sliding_window <= INT32_MAX,
             str("sliding_window must be in [0, 2^31), got ", sliding_window));
        need(window_from_layer >= 0, str("max_window_layers must be >= 0, got ", window_from_layer));
        need(layer_specs.empty() || int64_t(layer_specs.size()) == num_layers,
             str("layer_types lists ", layer_specs.size(), " layers; expected num_hidden_layers = ", num_layers));
        for (size_t l = 0; l < layer_specs.size(); ++l) {
            const LayerSpec& s = layer_specs[l];
            need(s.attention != AttnKind::SLIDING || (s.window > 0 && s.window <= INT32_MAX),
                 str("layer ", l, " is sliding_attention but its window is ", s.window, "; expected sliding_window in [1, 2^31)"));
            need(std::isfinite(s.rope_theta) && s.rope_theta >= 1 && s.rope_theta <= 1e10,
                 str("layer ", l, ": RoPE base ", s.rope_theta, " is implausible; expected [1, 1e10]"));
            need(s.rotary_fraction >= 0 && s.rotary_fraction <= 1,
                 str("layer ", l, ": rotary fraction ", s.rotary_fraction, " must be in [0, 1]"));
            need((s.mixer == LayerMixer::SHORT_CONV) == (s.attention == AttnKind::NONE),
                 str("layer ", l, " is ", layer_mixer_name(s.mixer), " with attention '", attn_kind_name(s.attention),
                     "'; expected attention 'none' exactly for a short_conv layer"));
            if (s.kv_source >= 0) {
                const int64_t src = s.kv_source;
                need(src < int64_t(l), str("layer ", l, " shares the keys and values of layer ", src, "; expected an earlier layer"));
                const LayerSpec& o = layer_specs[size_t(src)];
                need(o.kv_source < 0, str("layer ", l, " shares layer ", src, "'s keys and values, which are themselves shared; expected a layer with its own"));
                need(o.attention == s.attention && o.window == s.window && s.mixer == LayerMixer::ATTENTION,
                     str("layer ", l, " (", attn_kind_name(s.attention), ", window ", s.window, ") shares the keys and values of layer ", src,
                         " (", attn_kind_name(o.attention), ", window ", o.window, "); expected a source of the same attention type and window"));
                need(o.rope_theta == s.rope_theta && o.rotary_fraction == s.rotary_fraction && o.rope_scaled == s.rope_scaled,
                     str("layer ", l, " shares the keys of layer ", src, ", which are rotated with another RoPE; expected the same RoPE"));
            }
            need(s.mixer != LayerMixer::SHORT_CONV || (conv_kernel >= 1 && conv_kernel <= 64),
                 str("layer ", l, " is a short convolution but conv_L_cache is ", conv_kernel, "; expected a width in [1, 64]"));
        }
        if (has_experts()) {
            need(moe.num_experts >= 1 && moe.num_experts <= 4096,
                 str("num_local_experts must be in [1, 4096] for a mixture-of-experts MLP, got ", moe.num_experts));
            need(moe.top_k >= 1 && moe.top_k <= moe.num_experts,
                 str("num_experts_per_tok must be in [1, num_local_experts = ", moe.num_experts, "], got ", moe.top_k));
            need(std::isfinite(moe.limit) && moe.limit > 0, str("the experts' SwiGLU limit must be > 0, got ", moe.limit));
            need(std::isfinite(moe.alpha), str("the experts' SwiGLU alpha must be finite, got ", moe.alpha));
        }
        need(std::isfinite(attn_logit_softcap) && attn_logit_softcap >= 0,
             str("attn_logit_softcapping must be >= 0 (0 or null = none), got ", attn_logit_softcap));
        need(std::isfinite(final_logit_softcap) && final_logit_softcap >= 0,
             str("final_logit_softcapping must be >= 0 (0 or null = none), got ", final_logit_softcap));
        need(std::isfinite(query_pre_attn_scalar) && query_pre_attn_scalar >= 0,
             str("query_pre_attn_scalar must be > 0, got ", query_pre_attn_scalar));
        if (rope_scaling.type == "longrope") {
            const size_t pairs = size_t(rope_dims() / 2);
            need(rope_scaling.short_factor.size() == pairs && rope_scaling.long_factor.size() == pairs,
                 str("rope_scaling (longrope) has ", rope_scaling.short_factor.size(), " short_factor and ", rope_scaling.long_factor.size(),
                     " long_factor entries; expected one per rotated channel pair: ", pairs));
            need(rope_scaling.original_max_position_embeddings > 0,
                 str("rope_scaling (longrope) needs original_max_position_embeddings > 0, got ", rope_scaling.original_max_position_embeddings));
        }
        need(std::isfinite(embedding_scale) && embedding_scale > 0, str("embedding scale must be > 0, got ", embedding_scale));
        if (altup_enabled()) {
            need(altup.active_idx >= 0 && altup.active_idx < altup.num_inputs,
                 str("altup_active_idx ", altup.active_idx, " must be in [0, altup_num_inputs = ", altup.num_inputs, ")"));
            need(altup.num_inputs <= 16, str("altup_num_inputs ", altup.num_inputs, " is implausible; expected at most 16"));
            need(altup.laurel_rank > 0 && altup.per_layer_dim > 0 && altup.per_layer_vocab > 0,
                 str("Gemma 3n needs laurel_rank (", altup.laurel_rank, "), hidden_size_per_layer_input (", altup.per_layer_dim,
                     ") and vocab_size_per_layer_input (", altup.per_layer_vocab, ") > 0"));
            need(!latent_attention() && !fused_projections && !qkv_bias && !o_bias && !mlp_bias && !attention_sinks,
                 "Gemma 3n layers have separate q/k/v projections without biases or sinks");
        }
        for (size_t l = 0; l < layer_specs.size(); ++l)
            need(layer_specs[l].activation_sparsity >= 0 && layer_specs[l].activation_sparsity < 1,
                 str("activation_sparsity_pattern entry ", l, " is ", layer_specs[l].activation_sparsity, "; expected [0, 1)"));
        if (any_kv_shared())
            need(!latent_attention() && !fused_projections && !qkv_bias,
                 "cross-layer KV sharing is implemented for separate q/k/v projections without biases");
        if (latent_attention()) {
            const LatentAttention& a = latent;
            need(a.kv_lora_rank > 0, str("kv_lora_rank must be > 0, got ", a.kv_lora_rank));
            need(a.q_lora_rank >= 0, str("q_lora_rank must be > 0 or null, got ", a.q_lora_rank));
            need(a.qk_nope_head_dim >= 0 && a.qk_rope_head_dim > 0 && a.qk_rope_head_dim % 2 == 0,
                 str("qk_nope_head_dim (", a.qk_nope_head_dim, ") must be >= 0 and qk_rope_head_dim (", a.qk_rope_head_dim,
                     ") a positive even number"));
            need(head_dim == a.qk_nope_head_dim + a.qk_rope_head_dim,
                 str("latent attention: head_dim ", head_dim, " must equal qk_nope_head_dim + qk_rope_head_dim = ",
                     a.qk_nope_head_dim + a.qk_rope_head_dim));
            need(a.v_head_dim > 0 && a.v_head_dim <= head_dim,
                 str("v_head_dim ", a.v_head_dim, " must be in [1, qk_nope_head_dim + qk_rope_head_dim = ", head_dim,
                     "] (values are cached padded to the key head)"));
            need(num_kv_heads == num_heads, str("latent attention decompresses keys and values per query head: num_key_value_heads ",
                                                num_kv_heads, " must equal num_attention_heads ", num_heads));
            need(rope_dims() == a.qk_rope_head_dim,
                 str("latent attention rotates qk_rope_head_dim = ", a.qk_rope_head_dim, " channels, but partial_rotary_factor ",
                     partial_rotary_factor, " of head_dim ", head_dim, " gives ", rope_dims()));
            need(!qk_norm && !fused_projections && !qkv_bias && !attention_sinks,
                 "latent attention has no q/k norm, fused projection, q/k/v bias or sinks");
        }
    }
};

// Named tensors with Hugging Face names ("model.layers.3.self_attn.q_proj.weight"), the
// interchange format between loaders, the model and savers.
using TensorMap = std::map<std::string, Tensor>;

}  // namespace kv
