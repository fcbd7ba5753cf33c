// The `tiny` preset with random weights, built once per seed and shared by a test file's tests,
// and random byte-level token ids for it.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

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

}  // namespace kv::test
