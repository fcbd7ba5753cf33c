// keydiff (KeyDiff, Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for
// Long-Context LLM Inference in Resource-Constrained Environments"; as kvpress' KeyDiffPress):
// keys that point where most keys of their head point add little, so a slot's score is minus
// the cosine similarity of its key to the anchor, the mean of the row's unit keys:
//   a = (1/T) sum_j k_j / |k_j|,   score_j = -cos(k_j, a)
// recomputed after every chunk over the T slots then held. Needs no attention weights.
// Keys are kept as unit vectors per slot (+4 D bytes per slot per row, beside the buffer).
#include <algorithm>
#include <cmath>

#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class KeyDiffPolicy final : public ScorePolicy {
   public:
    KeyDiffPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G) : ScorePolicy(cfg, L, G) {}
    const char* name() const override { return "keydiff"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        unit_.clear();
        D_ = 0;
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) {
            D_ = f.head_dim;
            unit_.assign(size_t(rows() * L_ * D_), 0.0f);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        const float* k = f.keys.data() + i * D_;
        double n2 = 0;
        for (int64_t d = 0; d < D_; ++d) n2 += double(k[d]) * double(k[d]);
        const double inv = 1.0 / std::max(std::sqrt(n2), 1e-12);  // F.normalize's eps
        float* u = unit_.data() + (r * L_ + slot) * D_;
        for (int64_t d = 0; d < D_; ++d) u[d] = float(double(k[d]) * inv);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(unit_.begin() + (r * L_ + from) * D_, D_, unit_.begin() + (r * L_ + to) * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        const int64_t T = T_;
        anchor_.resize(size_t(D_));
        for (int64_t r = 0; r < rows(); ++r) {
            const float* U = unit_.data() + r * L_ * D_;
            std::fill(anchor_.begin(), anchor_.end(), 0.0);
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D_; ++d) anchor_[size_t(d)] += double(U[j * D_ + d]);
            double an = 0;
            for (double& a : anchor_) {
                a /= double(T);
                an += a * a;
            }
            // cos(k, a) = u . a / |a|; torch's cosine_similarity clamps |a| at 1e-8
            const double inv = 1.0 / std::max(std::sqrt(an), 1e-8);
            for (int64_t j = 0; j < T; ++j) {
                double dot = 0;
                for (int64_t d = 0; d < D_; ++d) dot += double(U[j * D_ + d]) * anchor_[size_t(d)];
                score_[size_t(r * L_ + j)] = float(-dot * inv);
            }
        }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t D_ = 0;
    std::vector<float> score_;    // (B*G, L)
    std::vector<float> unit_;     // (B*G, L, D) unit keys
    std::vector<double> anchor_;  // scratch: one row's mean unit key
};
}  // namespace

std::vector<PolicyInfo> keydiff_policies() {
    return {{.name = "keydiff",
             .summary = "KeyDiff: evict the keys most similar (cosine) to their head's mean unit key (no attention weights needed)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<KeyDiffPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .doc_anchor = "docs/POLICIES.md#keydiff"}};
}

}  // namespace kv
