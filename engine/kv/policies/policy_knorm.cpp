// knorm (kvpress' KnormPress): keys with a small L2 norm draw more attention, so a slot's
// score is minus its key's norm, fixed when the token is written (before any quantization).
// Needs no attention weights, so it runs on the fast SDPA path.
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class KnormPolicy final : public SlotScorePolicy {
   public:
    KnormPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : SlotScorePolicy(cfg, L, G) {}
    const char* name() const override { return "knorm"; }
    FeatureSet needs_features() const override { return {Feature::KeyNorm}; }

   protected:
    float initial_score(const InsertFeatures& f, int64_t i) const override { return f.key_norm.empty() ? 0.0f : -f.key_norm[size_t(i)]; }
};
}  // namespace

std::vector<PolicyInfo> knorm_policies() {
    return {{.name = "knorm",
             .summary = "Knorm: keep the keys of smallest L2 norm (no attention weights needed)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<KnormPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .doc_anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row"}};
}

}  // namespace kv
