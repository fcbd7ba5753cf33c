// Writing .safetensors files that Hugging Face tools load: the reference writer's layout
// (header JSON padded with spaces to a multiple of 8 so data starts 8-byte aligned; tensors
// ordered by dtype, widest first, then by name), written atomically (temp file + rename).
// It must not change names, dtypes or values: weights go out exactly as they are held.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/io/safetensors_parse.h"
#include "engine/core/model_config.h"

namespace kv {

using SafetensorsMetadata = std::map<std::string, std::string>;

// What transformers writes ({"format": "pt"}); without it `from_pretrained` warns.
inline SafetensorsMetadata safetensors_default_metadata() { return {{"format", "pt"}}; }

// The header as written: compact JSON ("__metadata__" first, then the entries in the given
// order, fields dtype/shape/data_offsets), padded with spaces to a multiple of 8 bytes.
// Throws kv::Error for names or metadata that are not valid UTF-8, the reserved name
// "__metadata__", and headers over the 100,000,000-byte limit.
std::string safetensors_header_json(const std::vector<SafetensorsEntry>& entries,
                                    const std::optional<SafetensorsMetadata>& metadata);

// Writes every tensor (any device, any strides; written contiguous, little-endian) under its
// map key. nullopt metadata omits "__metadata__".
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       const std::optional<SafetensorsMetadata>& metadata = safetensors_default_metadata());

}  // namespace kv
