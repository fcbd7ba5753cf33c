// knorm (kvpress' KnormPress): keys with a small L2 norm draw more attention, so a slot's
// score is minus its key's norm, fixed when the token is written (before any quantization).
// Needs no attention weights, so it runs on the fast SDPA path.
#include "policy_score_based.h"

namespace kv {

namespace {
class KnormPolicy final : public ScorePolicy {
   public:
    KnormPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : ScorePolicy(cfg, L, G) {}
    const char* name() const override { return "knorm"; }
    bool needs_key_norm() const override { return true; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        score_[size_t(r * L_ + slot)] = f.key_norm.empty() ? 0.0f : -f.key_norm[size_t(i)];
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override { score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)]; }
    void accumulate(const std::vector<float>&, int64_t) override {}
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    std::vector<float> score_;
};
}  // namespace

std::unique_ptr<KVPolicy> make_knorm_policy(const KVCacheConfig& cfg, int64_t L, int64_t G) {
    return std::make_unique<KnormPolicy>(cfg, L, G);
}

}  // namespace kv
