// The policy factory: one line per policy file.
#include "kv_policy.h"

#include "engine/core/error.h"

namespace kv {

std::unique_ptr<KVPolicy> make_positional_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);
std::unique_ptr<KVPolicy> make_smart_lastrec_policy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text);
std::unique_ptr<KVPolicy> make_h2o_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);
std::unique_ptr<KVPolicy> make_qh2o_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);
std::unique_ptr<KVPolicy> make_tova_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);
std::unique_ptr<KVPolicy> make_snapkv_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);
std::unique_ptr<KVPolicy> make_knorm_policy(const KVCacheConfig& cfg, int64_t L, int64_t G);

std::unique_ptr<KVPolicy> make_policy(const KVCacheConfig& cfg, int64_t L, int64_t G, const TextCodec* text) {
    const std::string p = cfg.policy();
    std::unique_ptr<KVPolicy> out;
    if (p == "dense" || p == "lastrec" || p == "streaming") out = make_positional_policy(cfg, L, G);
    else if (p == "smart-lastrec") out = make_smart_lastrec_policy(cfg, L, G, text);
    else if (p == "h2o" || p == "h2o-orig" || p == "h2o-vlen") out = make_h2o_policy(cfg, L, G);
    else if (p == "qh2o" || p == "qh2o-vlen") out = make_qh2o_policy(cfg, L, G);
    else if (p == "tova") out = make_tova_policy(cfg, L, G);
    else if (p == "snapkv") out = make_snapkv_policy(cfg, L, G);
    else if (p == "knorm") out = make_knorm_policy(cfg, L, G);
    if (!out) throw Error(str("unknown KV cache policy '", p, "'"));
    return out;
}

}  // namespace kv
