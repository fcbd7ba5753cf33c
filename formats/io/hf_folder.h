// Hugging Face model folders: config.json (+ generation_config.json), model.safetensors or
// model.safetensors.index.json with shards, tokenizer.json / tokenizer.model. Loading checks
// the weights against the config before returning; writing produces a folder HF tools load.
// Must not interpret the tokenizer (only its path is reported) or convert weight dtypes.
#pragma once

#include <string>

#include "engine/core/model_config.h"

namespace kv {

struct HfModelFolder {
    ModelConfig config;          // name = the folder's name
    TensorMap weights;           // HF names, memory-mapped (see safetensors_file.h)
    std::string tokenizer_path;  // tokenizer.json, else tokenizer.model, else empty
};

// config.json, then generation_config.json on top when present.
ModelConfig read_hf_model_config(const std::string& dir);

// Throws kv::Error naming the file for any problem: no config.json, no weights file, malformed
// files, weights that do not match the config (missing, mis-shaped, unexpected tensors).
HfModelFolder load_hf_model_folder(const std::string& dir);

// config.json and generation_config.json, each written atomically. Creates `dir` if needed.
void write_hf_model_config(const std::string& dir, const ModelConfig& cfg);

// write_hf_model_config plus model.safetensors; refuses weights that fail check_weights.
void write_hf_model_folder(const std::string& dir, const ModelConfig& cfg, const TensorMap& weights);

}  // namespace kv
