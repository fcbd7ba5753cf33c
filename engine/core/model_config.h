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

enum class Arch : uint8_t { LLAMA, MISTRAL, QWEN2, QWEN3, GPT2 };

inline const char* arch_name(Arch a) {
    switch (a) {
        case Arch::LLAMA: return "llama";
        case Arch::MISTRAL: return "mistral";
        case Arch::QWEN2: return "qwen2";
        case Arch::QWEN3: return "qwen3";
        case Arch::GPT2: return "gpt2";
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
    int64_t sliding_window = 0;     // 0 = none; else keys older than the window are masked
    int64_t window_from_layer = 0;  // first windowed layer: layers >= it use sliding_window
                                    // (Qwen2/3's max_window_layers; 0 for Mistral = all layers)

    int64_t bos_token_id = -1;
    std::vector<int64_t> eos_token_ids;
    int64_t pad_token_id = -1;

    DType dtype = DType::F32;  // storage dtype of the checkpoint ("torch_dtype")

    int64_t q_dim() const { return num_heads * head_dim; }
    int64_t kv_dim() const { return num_kv_heads * head_dim; }
    int64_t rope_dims() const { return int64_t(double(head_dim) * partial_rotary_factor) / 2 * 2; }
    int64_t group_size() const { return num_kv_heads ? num_heads / num_kv_heads : 0; }  // R
    // Layer l's attention window for ops::sdpa_ (0 = full causal attention). transformers'
    // Qwen2Config builds layer_types as "sliding_attention" iff sliding_window is set and
    // i >= max_window_layers; Mistral windows every layer.
    int layer_window(int64_t l) const { return sliding_window > 0 && l >= window_from_layer ? int(sliding_window) : 0; }

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
    }
};

// Named tensors with Hugging Face names ("model.layers.3.self_attn.q_proj.weight"), the
// interchange format between loaders, the model and savers.
using TensorMap = std::map<std::string, Tensor>;

}  // namespace kv
