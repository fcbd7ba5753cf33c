// Hugging Face config.json / generation_config.json <-> kv::ModelConfig, on strings only.
// Reads Llama (2/3, rope_scaling llama3), Mistral, Qwen2/2.5, Qwen3 and GPT-2; writes the same
// so presets and tests can produce folders HF tools load. No file access here (the fuzz target
// links this file alone); hf_folder.h does the reading and writing of files.
#pragma once

#include <string>

#include "engine/core/model_config.h"

namespace kv {

// Parses config.json text and calls ModelConfig::validate(source). Throws kv::Error naming
// `source`, the field and what was expected (unknown model_type/architecture, missing required
// fields, wrong JSON types, values out of range).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

// Applies generation_config.json (bos_token_id, eos_token_id as int or list, pad_token_id) on
// top of `cfg`; fields that are absent or null keep the values from config.json.
void apply_generation_config(const std::string& json_text, const std::string& source, ModelConfig& cfg);

// config.json text for `cfg` (2-space indented, trailing newline). Throws kv::Error when `cfg`
// cannot be expressed in its architecture's config.json (e.g. qwen2 without q/k/v biases).
std::string model_config_to_json(const ModelConfig& cfg);

// generation_config.json text carrying bos/eos/pad ids.
std::string generation_config_to_json(const ModelConfig& cfg);

}  // namespace kv
