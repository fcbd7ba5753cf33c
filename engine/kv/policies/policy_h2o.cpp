// H2O family (reference §4.6, §4.7): the score of a slot is the attention it has received,
// accumulated over chunks. h2o: per (b, g) row, optionally divided by the token's age;
// h2o-orig: the published H2O (weights summed over the batch, the same decision for every
// row, no normalisation); h2o-vlen: attention times the value norm, renormalised per chunk.
#include <algorithm>

#include "engine/kv/policies/policy_h2o.h"

namespace kv {

std::vector<PolicyInfo> h2o_policies() {
    const char* anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row";
    return {{.name = "h2o",
             .summary = "H2O: evict the least attention received, accumulated per (b, g) row",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<H2OPolicy>(a.cfg, a.L, a.G, H2OPolicy::Kind::H2O);
             },
             .needs_attention_weights = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size", "normalize_scores"},
             .doc_anchor = anchor},
            {.name = "h2o-orig",
             .summary = "the published H2O: increments summed over the batch, no grace ring or top-k",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 // keys_values rejects these options for h2o-orig, so its defaults always apply.
                 KVCacheConfig c = a.cfg;
                 c.grace_period = 0;
                 c.max_chunk_size = 0;
                 c.keep_initial_fraction = 0.05;
                 return std::make_unique<H2OPolicy>(c, a.L, a.G, H2OPolicy::Kind::ORIG);
             },
             .needs_attention_weights = true,
             .doc_anchor = anchor},
            {.name = "h2o-vlen",
             .summary = "H2O with attention weighted by value norms, renormalised per chunk",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<H2OPolicy>(a.cfg, a.L, a.G, H2OPolicy::Kind::VLEN);
             },
             .needs_attention_weights = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size", "normalize_scores"},
             .doc_anchor = anchor}};
}

}  // namespace kv
