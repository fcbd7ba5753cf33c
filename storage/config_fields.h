// Fields of a stored run's configuration JSON (the configuration itself is engine/run/run_config.h):
// reading fields of a run's configuration JSON by keys_values' dotted option names, whether the
// JSON is nested ({"kv_cache": {"name": "h2o-q8"}}) or flat ({"kv_cache.name": "h2o-q8"}), and
// splitting a cache name "{policy}-{buffer}" for tables and export labels. Never throws on
// malformed or missing config: absent fields read as "".
#pragma once

#include <string>

namespace kv::storage {

// The value at `dotted` as text ("" when absent; numbers and booleans as JSON text).
std::string run_config_value(const std::string& config_json, const std::string& dotted);

struct CacheName {
    std::string policy;  // "h2o", "qh2o-vlen", ...
    std::string buffer;  // "default", "q8", "q4", "nf4", "q8_0", "q4_0", ...
};
// "h2o-orig-q8" -> {"h2o-orig", "q8"}; a name without a known buffer suffix -> {name, "default"}.
CacheName split_cache_name(const std::string& name);

}  // namespace kv::storage
