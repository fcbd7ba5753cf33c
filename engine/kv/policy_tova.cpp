// tova (Token Omission Via Attention, as in kvpress' TOVAPress): evict the token the current
// queries attend to least. With chunks, the score of a slot is this chunk's attention-weight
// sum averaged over all KV heads of the batch row (so every head of a row decides alike);
// nothing accumulates across chunks.
#include "policy_score_based.h"

namespace kv {

namespace {
class TovaPolicy final : public ScorePolicy {
   public:
    TovaPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : ScorePolicy(cfg, L, G) {}
    const char* name() const override { return "tova"; }
    bool needs_attention_weights() const override { return true; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures&, int64_t) override { score_[size_t(r * L_ + slot)] = 0.0f; }
    void move_slot(int64_t r, int64_t from, int64_t to) override { score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)]; }
    void accumulate(const std::vector<float>& w, int64_t) override {
        if (w.empty()) return;
        const int64_t T = T_;
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t j = 0; j < T; ++j) {
                float s = 0;
                for (int64_t g = 0; g < G_; ++g) s += w[size_t((b * G_ + g) * T + j)];
                s /= float(G_);
                for (int64_t g = 0; g < G_; ++g) score_[size_t((b * G_ + g) * L_ + j)] = s;
            }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    std::vector<float> score_;
};
}  // namespace

std::unique_ptr<KVPolicy> make_tova_policy(const KVCacheConfig& cfg, int64_t L, int64_t G) {
    return std::make_unique<TovaPolicy>(cfg, L, G);
}

}  // namespace kv
