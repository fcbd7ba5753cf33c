// What a layer's cache is, in a few words, for the run summary and the views' layer labels
// (issue 40: the eviction map and cell grid name each layer's type): "full", "window 512",
// "shared with layer 1" (Gemma 3n's cross-layer KV), "convolution" (LFM2: a state, no tokens),
// "latent" (MLA's compressed cache); ", NoPE" when a full or windowed layer rotates nothing.
#pragma once

#include <string>

#include "engine/core/model_config.h"

namespace kv {

inline std::string layer_kind(const ModelConfig& mc, int64_t l) {
    const LayerSpec s = mc.layer_spec(l);
    if (s.mixer == LayerMixer::SHORT_CONV) return "convolution";
    if (s.kv_source >= 0) return "shared with layer " + std::to_string(s.kv_source);
    std::string k = mc.layer_window(l) > 0 ? "window " + std::to_string(mc.layer_window(l)) : mc.latent_cache() ? "latent" : "full";
    if (mc.layer_rope_dims(l) == 0) k += ", NoPE";
    return k;
}

}  // namespace kv
