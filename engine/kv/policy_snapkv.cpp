// snapkv (SnapKV-style selection, as kvpress' SnapKVPress): the last `window` queries of each
// chunk vote with their attention; votes are average-pooled over neighbouring token positions
// (width `kernel`, zero padding counted) so neighbours of important tokens survive too.
// Scores are replaced every chunk, not accumulated. Only the window's queries need weights.
#include <algorithm>
#include <numeric>

#include "policy_score_based.h"

namespace kv {

namespace {
class SnapKVPolicy final : public ScorePolicy {
   public:
    SnapKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G), window_(cfg.snapkv_window), kernel_(cfg.snapkv_kernel) {}
    const char* name() const override { return "snapkv"; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return window_; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures&, int64_t) override { score_[size_t(r * L_ + slot)] = 0.0f; }
    void move_slot(int64_t r, int64_t from, int64_t to) override { score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)]; }
    void accumulate(const std::vector<float>& w, int64_t) override {
        if (w.empty()) return;
        const int64_t T = T_, half = kernel_ / 2;
        std::vector<int32_t> order((size_t)T);
        std::vector<float> sorted((size_t)T);
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            // Neighbours are neighbours in the sequence, so pool in token-position order.
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
            for (int64_t i = 0; i < T; ++i) sorted[size_t(i)] = w[size_t(r * T + order[size_t(i)])];
            for (int64_t i = 0; i < T; ++i) {
                float s = 0;
                for (int64_t k = std::max<int64_t>(0, i - half); k <= std::min(T - 1, i + half); ++k) s += sorted[size_t(k)];
                score_[size_t(r * L_ + order[size_t(i)])] = s / float(kernel_);
            }
        }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t window_, kernel_;
    std::vector<float> score_;
};
}  // namespace

std::unique_ptr<KVPolicy> make_snapkv_policy(const KVCacheConfig& cfg, int64_t L, int64_t G) {
    return std::make_unique<SnapKVPolicy>(cfg, L, G);
}

}  // namespace kv
