// Built-in models with deterministic random weights, so kvlab runs with no download:
// `tiny` (milliseconds), `small`, and shape-only presets of real models for benchmarks.
// Weights are uniform with the std of the usual 0.02 init, per-tensor seeds from the name.
#pragma once

#include <string>
#include <vector>

#include "engine/core/model_config.h"

namespace kv {

struct PresetInfo {
    std::string name;
    std::string description;
};

std::vector<PresetInfo> list_presets();
bool is_preset(const std::string& name);
// Throws kv::Error listing the presets when `name` is unknown.
ModelConfig preset_config(const std::string& name);
// Deterministic weights with Hugging Face names for any config (dtype f32 or bf16).
TensorMap random_weights(const ModelConfig& cfg, uint64_t seed, DType dtype, Device device = Device{});

// The vocabulary of the byte-level presets: 256 bytes + <bos> <eos> <pad> (+ padding to 264).
constexpr int64_t kByteVocab = 264;
constexpr int32_t kByteBos = 256, kByteEos = 257, kBytePad = 258;

}  // namespace kv
