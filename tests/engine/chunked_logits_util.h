// Logits of a model over its input in chunks through a dense cache, gathered as one (B, T, V)
// tensor: how the fixture tests compare a chunked forward with the reference's whole-sequence one.
#pragma once

#include <algorithm>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"

namespace kv::test {

// ids (B, T) in chunks of `chunk` through `keep` (or a dense cache of its own), f64 (B, T, V).
inline Tensor chunked_logits(const Transformer& model, const ModelConfig& cfg, const Tensor& ids, int64_t chunk, int64_t V,
                             KVCache* keep = nullptr) {
    const int64_t B = ids.size(0), T = ids.size(1);
    KVCacheConfig kc;  // dense-default: keeps every position
    KVCache own(kc, cfg, Device{}, DType::F32, T);
    KVCache& cache = keep ? *keep : own;
    std::vector<double> got(size_t(B * T * V));
    for (int64_t s = 0; s < T; s += chunk) {
        const int64_t e = std::min(T, s + chunk);
        const std::vector<double> z = model.forward(ids.slice(1, s, e).contiguous(), s, &cache).to_f64_vector();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t t = s; t < e; ++t)
                for (int64_t v = 0; v < V; ++v) got[size_t((b * T + t) * V + v)] = z[size_t((b * (e - s) + (t - s)) * V + v)];
    }
    return Tensor::from_f64({B, T, V}, got);
}

}  // namespace kv::test
