// RoPE/YaRN tables (see rope.h); every formula is written as in the reference, in f64.
#include "rope.h"

#include <algorithm>
#include <cmath>

namespace kv {

const char* rope_mode_name(RopeMode m) {
    switch (m) {
        case RopeMode::YARN: return "yarn";
        case RopeMode::PLAIN: return "plain";
        case RopeMode::HF: return "hf";
    }
    return "?";
}

RopeMode rope_mode_from_name(const std::string& name) {
    if (name == "yarn") return RopeMode::YARN;
    if (name == "plain") return RopeMode::PLAIN;
    if (name == "hf") return RopeMode::HF;
    throw Error(str("unknown RoPE mode '", name, "'; expected yarn, plain or hf"));
}

RopeFrequencies rope_frequencies(const ModelConfig& cfg, int64_t context_width, RopeMode mode, double yarn_alpha,
                                 double yarn_beta) {
    LayerSpec s;
    s.rope_theta = cfg.rope_theta;
    s.rotary_fraction = cfg.partial_rotary_factor;
    return rope_frequencies(cfg, s, context_width, mode, yarn_alpha, yarn_beta);
}

RopeFrequencies rope_frequencies(const ModelConfig& cfg, const LayerSpec& layer, int64_t context_width, RopeMode mode,
                                 double yarn_alpha, double yarn_beta) {
    const int64_t m = int64_t(double(cfg.head_dim) * layer.rotary_fraction) / 2 * 2;
    const int64_t half = m / 2;
    RopeFrequencies f;
    f.inv_freq.resize((size_t)half);
    for (int64_t d = 0; d < half; ++d) f.inv_freq[size_t(d)] = std::pow(layer.rope_theta, -2.0 * double(d) / double(m));
    // query_pre_attn_scalar (Gemma) replaces head_dim in 1/sqrt(.); YaRN multiplies its factor in.
    const double base_scale = cfg.query_scale();
    f.attn_scale = base_scale;
    // A NoPE layer has nothing to interpolate; layers outside rope_scaling (Gemma 3's local
    // ones, whose window is far below the training length) keep their base frequencies.
    if (mode == RopeMode::PLAIN || m == 0 || !layer.rope_scaled) return f;

    // LongRoPE (Phi-3, Phi-4-mini): the factors are the model's own frequencies (it was trained
    // with the short ones), so they apply in yarn and hf mode alike, in place of kvlab's YaRN.
    // The context width decides short or long, as transformers' sequence length does for a
    // forward over the whole sequence.
    const RopeScaling& lr = cfg.rope_scaling;
    if (lr.type == "longrope") {
        const double orig = double(lr.original_max_position_embeddings);
        const std::vector<double>& fac = double(context_width) > orig ? lr.long_factor : lr.short_factor;
        if (fac.size() != size_t(half))
            throw Error(str("rope_scaling (longrope) has ", fac.size(), " factors; this layer rotates ", half, " channel pairs"));
        for (int64_t d = 0; d < half; ++d) f.inv_freq[size_t(d)] /= fac[size_t(d)];
        double a = lr.attention_factor;
        if (!(a > 0)) {
            const double s = double(cfg.max_position_embeddings) / orig;
            a = s <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s) / std::log(orig));
        }
        f.magnitude = a;
        return f;
    }

    if (mode == RopeMode::YARN) {
        if (!(yarn_alpha > 0 && yarn_alpha < yarn_beta))
            throw Error(str("YaRN factors must satisfy 0 < low_freq_factor < high_freq_factor, got ", yarn_alpha, " and ", yarn_beta));
        const double L_train = double(cfg.rope_scaling.original_max_position_embeddings > 0
                                          ? cfg.rope_scaling.original_max_position_embeddings
                                          : cfg.max_position_embeddings);
        const double s = std::max(1.0, double(context_width) / L_train);
        f.yarn_s = s;
        if (s > 1.0) {
            for (int64_t d = 0; d < half; ++d) {
                const double theta = f.inv_freq[size_t(d)];
                const double lambda = 2.0 * M_PI / theta;
                const double r = L_train / lambda;
                const double gamma = std::clamp((r - yarn_alpha) / (yarn_beta - yarn_alpha), 0.0, 1.0);
                f.inv_freq[size_t(d)] = (1.0 - gamma) * theta / s + gamma * theta;
            }
        }
        const double a = 0.1 * std::log(s) + 1.0;
        f.attn_scale = a * a * base_scale;
        return f;
    }

    // HF: apply config.json's rope_scaling as transformers does.
    const RopeScaling& rs = cfg.rope_scaling;
    if (rs.type == "linear") {
        for (auto& v : f.inv_freq) v /= rs.factor;
    } else if (rs.type == "llama3") {
        const double old_len = double(rs.original_max_position_embeddings);
        const double low_wavelen = old_len / rs.low_freq_factor, high_wavelen = old_len / rs.high_freq_factor;
        for (auto& v : f.inv_freq) {
            const double wavelen = 2.0 * M_PI / v;
            if (wavelen > low_wavelen) {
                v = v / rs.factor;
            } else if (wavelen >= high_wavelen) {
                const double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
                v = (1.0 - smooth) * v / rs.factor + smooth * v;
            }
        }
    } else if (!rs.type.empty() && rs.type != "default") {
        throw Error(str("rope_scaling type '", rs.type, "' is not supported in hf mode; use --model.rope yarn or plain"));
    }
    return f;
}

RopeTables build_rope_tables(const ModelConfig& cfg, int64_t context_width, RopeMode mode, Device device) {
    LayerSpec s;
    s.rope_theta = cfg.rope_theta;
    s.rotary_fraction = cfg.partial_rotary_factor;
    return build_rope_tables(cfg, s, context_width, mode, device);
}

RopeTables build_rope_tables(const ModelConfig& cfg, const LayerSpec& layer, int64_t context_width, RopeMode mode,
                             Device device, DType table_dtype) {
    if (context_width <= 0) throw Error(str("RoPE context width must be > 0, got ", context_width));
    RopeFrequencies f = rope_frequencies(cfg, layer, context_width, mode);
    const int64_t half = int64_t(f.inv_freq.size());
    std::vector<double> c((size_t)(context_width * half)), s((size_t)(context_width * half));
    for (int64_t p = 0; p < context_width; ++p)
        for (int64_t d = 0; d < half; ++d) {
            const double ang = double(p) * f.inv_freq[size_t(d)];
            c[size_t(p * half + d)] = f.magnitude * std::cos(ang);
            s[size_t(p * half + d)] = f.magnitude * std::sin(ang);
        }
    RopeTables t;
    TensorOptions o{device, MemCategory::WEIGHTS, "rope tables"};
    if (half > 0) {  // a NoPE layer has no tables (n_rot 0)
        if (table_dtype == DType::F64) {
            t.cos = Tensor::from_f64({context_width, half}, c, DType::F64, o);
            t.sin = Tensor::from_f64({context_width, half}, s, DType::F64, o);
        } else {
            const std::vector<float> c32(c.begin(), c.end()), s32(s.begin(), s.end());
            t.cos = Tensor::from_f32({context_width, half}, c32, DType::F32, o);
            t.sin = Tensor::from_f32({context_width, half}, s32, DType::F32, o);
        }
    }
    t.attn_scale = float(f.attn_scale);
    t.context_width = context_width;
    t.n_rot = int(2 * half);
    t.yarn_s = f.yarn_s;
    t.inv_freq = f.inv_freq;
    return t;
}

}  // namespace kv
