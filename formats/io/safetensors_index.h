// Sharded checkpoints: model.safetensors.index.json = {"metadata": {...}, "weight_map":
// {tensor name: shard file}}. Parsing is on strings (no files); loading maps every shard and
// checks that the index and the shards agree exactly. Must not guess: a name that is missing,
// misplaced or present twice is an error, never silently skipped.
#pragma once

#include <map>
#include <string>

#include "formats/io/safetensors_file.h"

namespace kv {

struct SafetensorsIndex {
    std::map<std::string, std::string> metadata;    // values as text (strings unquoted, numbers as JSON)
    std::map<std::string, std::string> weight_map;  // tensor name → shard file name (same folder)
};

// Throws kv::Error naming `source` for bad JSON, a missing or mistyped weight_map, and shard
// names that are not plain file names.
SafetensorsIndex parse_safetensors_index(const std::string& json_text, const std::string& source);

// Loads the index and every shard it names (relative to the index's folder). The result's
// metadata is the index's. Throws when a shard is missing, a mapped name is absent from its
// shard, or a shard holds a tensor the index does not map to it.
SafetensorsContents load_safetensors_sharded(const std::string& index_path);

}  // namespace kv
