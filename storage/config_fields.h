// Fields of a stored run's configuration JSON (the configuration itself is engine/run/run_config.h):
// reading fields of a run's configuration JSON by keys_values' dotted option names, whether the
// JSON is nested ({"kv_cache": {"name": "h2o-q8"}}) or flat ({"kv_cache.name": "h2o-q8"}), and
// the run's cache name through the one parser (engine/core/cache_name.h). Never throws on
// malformed or missing config: absent fields read as "".
#pragma once

#include <optional>
#include <string>

#include "engine/core/cache_name.h"

namespace kv::storage {

// Views and the app name it as storage::CacheName (views include storage/ alone).
using kv::CacheName;

// The value at `dotted` as text ("" when absent; numbers and booleans as JSON text).
// "kv_cache.name" reads in canonical spelling (canonical_cache_name).
std::string run_config_value(const std::string& config_json, const std::string& dotted);

// A stored cache name in canonical spelling ("h2o-torch-quantized8" -> "h2o-q8"): sessions
// written before the run options stored names canonically hold aliases. A name the parser
// cannot split is returned as stored.
std::string canonical_cache_name(const std::string& stored);

// The run's cache name, split by the one parser: {"h2o-orig", "q8"}. A name without a known
// buffer reads as {name, "default"}, as the engine reads it; nullopt when the config has none.
std::optional<CacheName> run_cache_name(const std::string& config_json);
// Its policy part ("" when the config has no cache name).
std::string run_policy(const std::string& config_json);
// The run evaluates with losses and task metrics (its mode's entry in the run-mode table,
// engine/core/run_mode.h: eval_long), the runs a sweep's quality curves are made of.
bool run_evaluates_quality(const std::string& config_json);

}  // namespace kv::storage
