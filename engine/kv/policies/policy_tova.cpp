// tova (Token Omission Via Attention, as in kvpress' TOVAPress): evict the token the current
// queries attend to least. With chunks, the score of a slot is this chunk's attention-weight
// sum averaged over all KV heads of the batch row (so every head of a row decides alike);
// nothing accumulates across chunks.
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class TovaPolicy final : public SlotScorePolicy {
   public:
    TovaPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : SlotScorePolicy(cfg, L, G) {}
    const char* name() const override { return "tova"; }
    bool needs_attention_weights() const override { return true; }

   protected:
    void accumulate(const std::vector<float>& w, int64_t) override {
        if (w.empty()) return;
        const int64_t T = T_;
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t j = 0; j < T; ++j) {
                float s = 0;
                for (int64_t g = 0; g < G_; ++g) s += w[size_t((b * G_ + g) * T + j)];
                s /= float(G_);
                for (int64_t g = 0; g < G_; ++g) score(b * G_ + g, j) = s;
            }
    }
};
}  // namespace

std::vector<PolicyInfo> tova_policies() {
    return {{.name = "tova",
             .summary = "TOVA: evict the slot this chunk's queries attend to least (mean over the row's KV heads)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<TovaPolicy>(a.cfg, a.L, a.G); },
             .needs_attention_weights = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .doc_anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row"}};
}

}  // namespace kv
