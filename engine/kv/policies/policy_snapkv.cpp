// snapkv (SnapKV, Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before
// Generation"; as kvpress' SnapKVPress): the last `window` queries of each chunk vote with their
// attention; votes are average-pooled over neighbouring token positions (width `kernel`, zero
// padding counted) so neighbours of important tokens survive too. By default (the published
// rule) only the positions before the window are pooled and the window's own tokens take the
// maximum score; snapkv_pool_window 1 pools the window's tokens with the rest (kvlab's earlier
// rule). Scores are replaced every chunk, not accumulated. Only the window's queries need weights.
// pyramidkv (PyramidKV) is the same scorer with per-layer budgets that shrink with depth (its
// descriptor's default layer rule, kv_config.cpp layer_lengths_from_rule).
#include "engine/kv/policies/policy_snapkv.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/position_order.h"

namespace kv {

void SnapKVVotes::score(const std::vector<float>& w, const int32_t* pos, int64_t rows, int64_t stride, int64_t T, int64_t P, int64_t n,
                        float* out) const {
    const int64_t half = kernel / 2, first = P - std::min(window, n);  // the window: positions [first, P)
    order_.resize(size_t(T));
    sorted_.resize(size_t(T));
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t* p = pos + r * stride;
        float* o = out + r * stride;
        // Neighbours are neighbours in the sequence, so pool in token-position order.
        slots_by_position(p, T, order_, table_);
        int64_t lo = 0, m = T;  // the pooled slots: order_[lo, m)
        if (!pool_window) {
            while (lo < T && p[order_[size_t(lo)]] < 0) o[order_[size_t(lo++)]] = 0.0f;  // empty (ada: another head's)
            m = lo;
            while (m < T && p[order_[size_t(m)]] < first) ++m;
        }
        for (int64_t i = lo; i < m; ++i) sorted_[size_t(i)] = w[size_t(r * T + order_[size_t(i)])];
        for (int64_t i = lo; i < m; ++i) {
            float s = 0;
            for (int64_t k = std::max(lo, i - half); k <= std::min(m - 1, i + half); ++k) s += sorted_[size_t(k)];
            o[order_[size_t(i)]] = s / float(kernel);
            top = std::max(top, o[order_[size_t(i)]]);
        }
    }
    if (pool_window) return;
    // The window is kept (kvpress pads it with scores.max() over the whole layer).
    if (top == -std::numeric_limits<float>::infinity()) top = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[r * stride + j] >= first) out[r * stride + j] = top;
}

namespace {
class SnapKVPolicy final : public SlotScorePolicy {
   public:
    SnapKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, const char* name)
        : SlotScorePolicy(cfg, L, G), name_(name) {
        votes_.window = cfg.snapkv_window;
        votes_.kernel = cfg.snapkv_kernel;
        votes_.pool_window = cfg.policy_option("snapkv_pool_window") != 0;
    }
    const char* name() const override { return name_; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return votes_.window; }

   protected:
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (w.empty()) return;
        votes_.score(w, pos_.data(), rows(), L_, T_, P_, n, &score(0, 0));
    }

   private:
    SnapKVVotes votes_;
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
             .options = {{.name = "snapkv_pool_window",
                          .help = "snapkv, pyramidkv, ada-snapkv: 0 pools votes before the window only (published), 1 pools the window too",
                          .def = 0,
                          .lo = 0,
                          .hi = 1,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#snapkv"},
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
