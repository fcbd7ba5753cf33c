// A KV cache's identity, "{policy}-{buffer}" (keys_values' naming), as a typed value with one
// parser and one printer. Every layer reads names through here: the run options parse a name
// once and store text() (canonical: aliases become their buffer's name), and storage's readers
// split stored names the same way, so a session written before names were canonical still
// lists canonically.
//
// Why in the core: storage stands on the core alone and must split names too. The buffer table
// is a core table (kv_names.h); the policy table is not (its entries carry engine factories), so
// the engine hands its names in as a list (engine/kv/kv_config.h: parse_kv_cache_name) and the
// reader side, which only labels stored names, splits by the buffer suffix alone. Dependencies
// stay one-way and there is still one split.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kv {

struct CacheName {
    std::string policy;  // a policy registry name: "h2o", "h2o-orig", "smart-lastrec"
    std::string buffer;  // a canonical buffer name (kv_names.h): "default", "q8" (never an alias)

    std::string text() const { return policy + "-" + buffer; }  // the one printer: "h2o-q8"
    bool operator==(const CacheName&) const = default;
};

// The one parser. `policies`: the names the policy part must be one of (the engine passes
// kv_policy_names()). Throws kv::Error naming the text and listing the policies, buffers and
// aliases when the name is not "{policy}-{buffer}" with known parts.
CacheName parse_cache_name(const std::string& text, const std::vector<std::string>& policies);

// The same split without a policy list, for readers of stored names: the buffer is the longest
// suffix after a '-' that is a buffer name or alias, the policy the text before it (unchecked).
// nullopt when no buffer suffix is found. Never throws.
std::optional<CacheName> read_cache_name(const std::string& text);

}  // namespace kv
