// Per-head ratio tables (LUKV's layer x head budget curves, kvpress PR #236 `LUKVPress`;
// docs/POLICIES.md#lukv-per-head-ratio-tables): --kv_cache.head_ratios gives every (layer, KV
// head) its own fraction of the layer's cache length. The lukv-* policies
// (engine/kv/policies/policy_lukv.cpp) keep each head's share in the layer's slot pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kv {

struct KVCacheConfig;

// A table as the run stores it: one row of KV-head ratios per layer, or a pattern repeated over
// the (layer, head) pairs in order (layer 0's heads, then layer 1's, ...), which fits any model.
struct HeadRatioTable {
    std::vector<std::vector<double>> layers;
    std::vector<double> pattern;
};

// "R,R;R,R" (';' between layers, ',' or spaces between heads), "pattern:R0,R1,..." or FILE (one
// line per layer, ratios separated by commas or spaces, '#' starts a comment); every ratio in
// (0, 1]. Throws kv::Error naming the option and the bad entry.
HeadRatioTable parse_head_ratios(const std::string& text);
// The canonical text of a table ("1,0.5;0.25,1" or "pattern:1,0.5"): a file's numbers, so a run
// never depends on the file again.
std::string head_ratios_text(const HeadRatioTable& t);
// --kv_cache.head_ratios: parses `text` now and stores its canonical text (empty: no table).
void set_head_ratios(KVCacheConfig& cfg, const std::string& text);
// Throws kv::Error when the table is not one row per layer of num_kv_heads ratios each.
void check_head_ratios(const std::string& stored, int64_t num_layers, int64_t num_kv_heads);
// Slots of each of layer `layer`'s G heads for a layer length L: max(1, round(R_{l,g} L)).
std::vector<int64_t> head_budgets(const std::string& stored, int64_t L, int64_t G, int64_t layer);

}  // namespace kv
