// RoPE and YaRN exactly as keys_values (reference §6): base frequencies theta_d, the YaRN
// blend with scale s = max(1, context_width / L_train), and the attention scale
// (0.1 ln s + 1)^2 / sqrt(D). Tables are computed in f64 and stored f32 (cos, sin).
#pragma once

#include <string>
#include <vector>

#include "engine/core/model_config.h"

namespace kv {

enum class RopeMode : uint8_t {
    YARN,   // keys_values default: YaRN blend once the context exceeds the training length
    PLAIN,  // theta_d = base^{-2d/m}, scale 1/sqrt(D), no interpolation
    HF,     // as Hugging Face reads config.json (rope_scaling "llama3" / "linear"; else plain)
};

const char* rope_mode_name(RopeMode m);
RopeMode rope_mode_from_name(const std::string& name);  // throws kv::Error listing the names

// The rotation frequencies theta'_d (d < n_rot/2) and the attention scale for a context width.
struct RopeFrequencies {
    std::vector<double> inv_freq;  // theta'_d
    double attn_scale = 1.0;       // multiplies q.k
    double yarn_s = 1.0;           // YaRN scale factor s (1 = no interpolation)
    // Multiplies the cos and sin tables (LongRoPE's attention factor): transformers scales cos
    // and sin, so only the rotated channels of q and k grow, not the pass-through ones.
    double magnitude = 1.0;
};

// The model-level RoPE (rope_theta, partial_rotary_factor), and one layer's (LayerSpec: its
// base, rotated fraction, whether rope_scaling applies; no rotated channels = NoPE: no
// frequencies, plain scale). The attention scale is ModelConfig::query_scale() times YaRN's factor.
RopeFrequencies rope_frequencies(const ModelConfig& cfg, int64_t context_width, RopeMode mode,
                                 double yarn_alpha = 1.0, double yarn_beta = 32.0);
RopeFrequencies rope_frequencies(const ModelConfig& cfg, const LayerSpec& layer, int64_t context_width, RopeMode mode,
                                 double yarn_alpha = 1.0, double yarn_beta = 32.0);

// cos/sin tables (context_width, n_rot/2) on `device`, angle = p * theta'_d: f64 when
// `table_dtype` is F64 (a model computing in f64), else f32 (f32 tables alone put a forward ~5e-6 off the f64 math on Gemma 3n).
struct RopeTables {
    Tensor cos, sin;
    float attn_scale = 1.0f;
    int64_t context_width = 0;
    int n_rot = 0;
    double yarn_s = 1.0;
    std::vector<double> inv_freq;  // theta'_d of the tables (host), for caches that rotate query statistics
};

RopeTables build_rope_tables(const ModelConfig& cfg, int64_t context_width, RopeMode mode, Device device);
RopeTables build_rope_tables(const ModelConfig& cfg, const LayerSpec& layer, int64_t context_width, RopeMode mode,
                             Device device, DType table_dtype = DType::F32);

}  // namespace kv
