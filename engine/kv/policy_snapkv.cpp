// snapkv (SnapKV-style selection, as kvpress' SnapKVPress): the last `window` queries of each
// chunk vote with their attention; votes are average-pooled over neighbouring token positions
// (width `kernel`, zero padding counted) so neighbours of important tokens survive too.
// Scores are replaced every chunk, not accumulated. Only the window's queries need weights.
// pyramidkv (PyramidKV) is the same scorer with per-layer budgets that shrink with depth (its
// descriptor's default layer rule, kv_config.cpp layer_lengths_from_rule).
#include <algorithm>
#include <numeric>

#include "policy_score_based.h"

namespace kv {

namespace {
class SnapKVPolicy final : public SlotScorePolicy {
   public:
    SnapKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const char* name)
        : SlotScorePolicy(cfg, L, G), window_(cfg.snapkv_window), kernel_(cfg.snapkv_kernel), name_(name) {}
    const char* name() const override { return name_; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return window_; }

   protected:
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
                score(r, order[size_t(i)]) = s / float(kernel_);
            }
        }
    }

   private:
    int64_t window_, kernel_;
    const char* name_;
};
}  // namespace

std::vector<PolicyInfo> snapkv_policies() {
    const std::vector<std::string> uses = {"snapkv_window", "snapkv_kernel", "grace_period", "keep_initial_fraction", "max_chunk_size"};
    return {{.name = "snapkv",
             .summary = "SnapKV: the chunk's last snapkv_window queries vote, pooled over snapkv_kernel neighbours",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<SnapKVPolicy>(a.cfg, a.L, a.G, "snapkv");
             },
             .needs_attention_weights = true,
             .uses = uses,
             .doc_anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row"},
            {.name = "pyramidkv",
             .summary = "PyramidKV: SnapKV scores with per-layer budgets shrinking with depth (layer rule pyramid:20)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<SnapKVPolicy>(a.cfg, a.L, a.G, "pyramidkv");
             },
             .needs_attention_weights = true,
             .uses = uses,
             .default_layer_rule = "pyramid:20",
             .doc_anchor = "docs/POLICIES.md#pyramidkv"}};
}

}  // namespace kv
