// Loading a .safetensors file: memory-maps it and hands out kv::Tensors that point into the
// mapping (category WEIGHTS, label = tensor name), each keeping the mapping alive. Validation is
// parse_safetensors_header's; this layer only maps, converts dtypes and builds tensors.
// It must not copy tensor data except where the file's alignment forces it (see .cpp).
#pragma once

#include <map>
#include <string>

#include "engine/core/model_config.h"

namespace kv {

struct SafetensorsContents {
    TensorMap tensors;                            // file names → tensors (cpu)
    bool has_metadata = false;                    // "__metadata__" present
    std::map<std::string, std::string> metadata;  // "__metadata__" (e.g. {"format": "pt"})
};

// Throws kv::Error naming `path` for unreadable files, malformed headers and dtypes kvlab cannot
// hold (I8, I16, U16, U32, U64, C64, F8_*, F6_*, F4).
SafetensorsContents load_safetensors(const std::string& path);

}  // namespace kv
