// simlayerkv (SimLayerKV, Zhang et al. 2024, "SimLayerKV: A Simple Framework for Layer-Level KV
// Cache Reduction"; as kvpress' SimLayerKVPress): a layer whose last queries put almost all their
// attention on the initial and the recent tokens is "lazy" and needs no more than a streaming
// cache; the other layers keep what their attention asks for. After every chunk (the last
// `simlayerkv_window` queries' weights w, mean over batch rows, query heads and queries):
//   m = sum of w over slots at positions p < sinks or p >= P - simlayerkv_recent,
//   lazy = m > simlayerkv_threshold                           (kvpress' strict test)
// one decision per layer. A lazy layer scores slots by position (sinks kept, the oldest of the
// rest evicted first: StreamingLLM); a busy layer scores them with SnapKV's votes of the same
// queries (policy_snapkv.h). kvpress' busy layers keep everything; at a fixed per-layer budget
// something must go, and the votes are what the test already computed.
#include <algorithm>
#include <limits>

#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/policy_snapkv.h"

namespace kv {

namespace {
class SimLayerKVPolicy final : public SlotScorePolicy {
   public:
    SimLayerKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : SlotScorePolicy(cfg, L, G),
          sinks_(cfg.sinks),
          recent_(int64_t(cfg.policy_option("simlayerkv_recent"))),
          threshold_(cfg.policy_option("simlayerkv_threshold")) {
        votes_.window = int64_t(cfg.policy_option("simlayerkv_window"));
        votes_.kernel = cfg.snapkv_kernel;
    }
    const char* name() const override { return "simlayerkv"; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return votes_.window; }
    void reset(int64_t batch) override {
        SlotScorePolicy::reset(batch);
        lazy_ = false;
    }

   protected:
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (w.empty()) return;
        const int64_t T = T_;
        // Each query's weights sum to 1 over the slots, so the share of the total is kvpress'
        // mean over batch, heads and queries without knowing the group size.
        double near = 0, all = 0;
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j) {
                const int32_t p = pos_[size_t(r * L_ + j)];
                const double x = double(w[size_t(r * T + j)]);
                all += x;
                if (p >= 0 && (p < sinks_ || p >= P_ - recent_)) near += x;
            }
        lazy_ = all > 0 && near / all > threshold_;
        if (!lazy_) {
            votes_.score(w, pos_.data(), rows(), L_, T, P_, n, &score(0, 0));
            return;
        }
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j) {
                const int32_t p = pos_[size_t(r * L_ + j)];
                score(r, j) = p < sinks_ ? std::numeric_limits<float>::max() : float(p);
            }
    }

   private:
    int64_t sinks_, recent_;
    double threshold_;
    SnapKVVotes votes_;
    bool lazy_ = false;
};
}  // namespace

std::vector<PolicyInfo> simlayerkv_policies() {
    return {{.name = "simlayerkv",
             .summary = "SimLayerKV: layers whose last queries attend to the sinks and recent tokens evict as streaming, the others by SnapKV votes",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<SimLayerKVPolicy>(a.cfg, a.L, a.G); },
             .needs_attention_weights = true,
             .uses = {"sinks", "snapkv_kernel", "grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "simlayerkv_threshold",
                          .help = "simlayerkv: a layer is lazy when its last queries' attention share on the sinks and recent tokens exceeds this",
                          .def = 0.9,
                          .lo = 0,
                          .hi = 1},
                         {.name = "simlayerkv_recent",
                          .help = "simlayerkv: the most recent positions counted as recent by the laziness test",
                          .def = 1024,
                          .lo = 1,
                          .hi = 1 << 24,
                          .integer = true},
                         {.name = "simlayerkv_window",
                          .help = "simlayerkv: last queries of a chunk whose attention decides laziness (and votes in busy layers)",
                          .def = 1,
                          .lo = 1,
                          .hi = 1 << 20,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#simlayerkv"}};
}

}  // namespace kv
