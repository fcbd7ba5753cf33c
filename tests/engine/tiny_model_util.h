// The `tiny` preset with random weights, built once per seed and shared by a test file's tests,
// and random byte-level token ids for it.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"

namespace kv::test {

struct TinyModel {
    explicit TinyModel(uint64_t seed) : cfg(preset_config("tiny")), model(cfg, random_weights(cfg, seed, DType::F32), ModelOptions{}) {}
    ModelConfig cfg;
    Transformer model;
};

template <uint64_t Seed>
TinyModel& tiny_model() {
    static TinyModel m(Seed);
    return m;
}

// T ids drawn uniformly from the 256 byte tokens.
inline std::vector<int32_t> random_tokens(int64_t T, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int32_t> v(static_cast<size_t>(T));
    for (auto& x : v) x = int32_t(rng() % 256);
    return v;
}

// The kept positions of every layer and KV head of a tiny model with a cache of `name` (16 slots,
// `setup` adjusting its configuration) after 64 random tokens (seed `token_seed`): a prefill of
// 8, a chunk of 8 that fills the slots, then chunks of 4 (no keep-initial rule: the prefill is
// not full). A policy whose heads share one row gives each head that row.
inline std::vector<std::vector<std::set<int32_t>>> tiny_kept_sets(TinyModel& tm, uint64_t token_seed, const std::string& name,
                                                                  const std::function<void(KVCacheConfig&)>& setup) {
    constexpr int64_t L = 16, T = 64;
    KVCacheConfig kc;
    kc.name = name;
    kc.cache_length = L;
    setup(kc);
    KVCache cache(kc, tm.cfg, Device{}, DType::F32, T);
    const std::vector<int32_t> ids = random_tokens(T, token_seed);
    const Tensor all = Tensor::from_i32({1, T}, ids);
    std::vector<std::pair<int64_t, int64_t>> chunks = {{0, 8}, {8, 8}};
    for (int64_t s = 16; s < T; s += 4) chunks.push_back({s, 4});
    for (const auto& [s, n] : chunks) (void)tm.model.forward(all.slice(1, s, s + n).contiguous(), s, &cache);
    std::vector<std::vector<std::set<int32_t>>> out;
    for (int l = 0; l < tm.cfg.num_layers; ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        const auto& pos = p.token_positions();
        out.emplace_back();
        for (int64_t g = 0; g < tm.cfg.num_kv_heads; ++g) {
            const int64_t at = p.per_row_positions() ? g * L : 0;
            out.back().emplace_back(pos.begin() + at, pos.begin() + at + L);
        }
    }
    return out;
}

}  // namespace kv::test
