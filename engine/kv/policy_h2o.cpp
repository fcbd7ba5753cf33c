// H2O family (reference §4.6, §4.7): the score of a slot is the attention it has received,
// accumulated over chunks. h2o: per (b, g) row, optionally divided by the token's age;
// h2o-orig: the published H2O (weights summed over the batch, the same decision for every
// row, no normalisation); h2o-vlen: attention times the value norm, renormalised per chunk.
#include <algorithm>

#include "policy_h2o.h"

namespace kv {

std::unique_ptr<KVPolicy> make_h2o_policy(const KVCacheConfig& cfg, int64_t L, int64_t G) {
    const std::string p = cfg.policy();
    if (p == "h2o") return std::make_unique<H2OPolicy>(cfg, L, G, H2OPolicy::Kind::H2O);
    if (p == "h2o-vlen") return std::make_unique<H2OPolicy>(cfg, L, G, H2OPolicy::Kind::VLEN);
    if (p == "h2o-orig") {
        // keys_values rejects these options for h2o-orig, so its defaults always apply.
        KVCacheConfig c = cfg;
        c.grace_period = 0;
        c.max_chunk_size = 0;
        c.keep_initial_fraction = 0.05;
        return std::make_unique<H2OPolicy>(c, L, G, H2OPolicy::Kind::ORIG);
    }
    return nullptr;
}

}  // namespace kv
