// observed-attention (kvpress' ObservedAttentionPress, H2O's accumulated attention made a mean):
// a slot's score is the attention its token has received from every query since it entered,
// averaged over those queries — the mean over the group's heads of
//   acc_j / (P - pos_j),   acc_j = sum over every query seen of its weight on slot j,
// with P the input position after the last chunk (P - pos_j queries could see the token).
// Unlike h2o's sum, a young token is not penalised for having been seen by fewer queries.
#include <algorithm>

#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class ObservedAttentionPolicy final : public ScorePolicy {
   public:
    ObservedAttentionPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : ScorePolicy(cfg, L, G) {}
    const char* name() const override { return "observed-attention"; }
    bool needs_attention_weights() const override { return true; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        acc_.assign(size_t(rows() * L_), 0.0);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures&, int64_t) override { acc_[size_t(r * L_ + slot)] = 0.0; }
    void move_slot(int64_t r, int64_t from, int64_t to) override { acc_[size_t(r * L_ + to)] = acc_[size_t(r * L_ + from)]; }
    void accumulate(const std::vector<float>& w, int64_t) override {
        if (w.empty()) return;
        const int64_t T = T_;
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j) acc_[size_t(r * L_ + j)] += double(w[size_t(r * T + j)]);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) {
                const int64_t seen = std::max<int64_t>(1, P_ - pos_[size_t(r * L_ + j)]);
                S[size_t(r * cand + j)] = float(acc_[size_t(r * L_ + j)] / double(seen));
            }
    }

   private:
    std::vector<double> acc_;  // (B*G, L) attention received, summed over queries
};
}  // namespace

std::vector<PolicyInfo> observed_attention_policies() {
    return {{.name = "observed-attention",
             .summary = "ObservedAttention: mean attention a token received from every query since it entered",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<ObservedAttentionPolicy>(a.cfg, a.L, a.G);
             },
             .needs_attention_weights = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .doc_anchor = "docs/POLICIES.md#observed-attention"}};
}

}  // namespace kv
