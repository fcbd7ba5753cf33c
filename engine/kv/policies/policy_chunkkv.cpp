// chunkkv (ChunkKV, Liu et al. 2025, "ChunkKV: Semantic-Preserving KV Cache Compression for
// Efficient Long-Context LLM Inference"; as kvpress' ChunkKVPress around SnapKVPress, the
// leaderboard's configuration): tokens are kept or evicted in chunks of `chunkkv_chunk_size`
// consecutive positions (chunk c = positions [c C, (c + 1) C)), so a kept fact keeps its
// neighbours. After every chunk, with s the SnapKV scores (policy_snapkv.h: the published
// window rule unless snapkv_pool_window says otherwise), every slot of chunk c in batch row b
// scores
//   S_c = (sum over the row's G heads and the cached tokens of c of s) / seen_c,
//   seen_c = min(C, P - c C)    (positions of c the sequence has reached)
// kvpress' chunk mean: evicted members count 0, so a chunk cut by an eviction goes next, and
// whole chunks leave. Every head of a batch row decides alike (kvpress selects per layer).
#include <algorithm>
#include <numeric>

#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/policy_snapkv.h"

namespace kv {

namespace {
class ChunkKVPolicy final : public SlotScorePolicy {
   public:
    ChunkKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : SlotScorePolicy(cfg, L, G), C_(int64_t(cfg.policy_option("chunkkv_chunk_size"))) {
        votes_.window = cfg.snapkv_window;
        votes_.kernel = cfg.snapkv_kernel;
        votes_.pool_window = cfg.policy_option("snapkv_pool_window") != 0;
    }
    const char* name() const override { return "chunkkv"; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return votes_.window; }

   protected:
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (w.empty()) return;
        const int64_t T = T_;
        tok_.resize(size_t(rows() * L_));
        votes_.score(w, pos_.data(), rows(), L_, T, P_, n, tok_.data());
        for (int64_t b = 0; b < B_; ++b) {
            // (chunk, token score) of every cached token of the batch row's heads, by chunk
            cells_.clear();
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t j = 0; j < T; ++j) {
                    const int64_t r = b * G_ + g;
                    const int32_t p = pos_[size_t(r * L_ + j)];
                    if (p >= 0) cells_.push_back({p / C_, double(tok_[size_t(r * L_ + j)])});
                }
            std::sort(cells_.begin(), cells_.end(), [](const Cell& x, const Cell& y) { return x.chunk < y.chunk; });
            chunks_.clear();
            sums_.clear();
            for (const Cell& c : cells_) {
                if (chunks_.empty() || chunks_.back() != c.chunk) chunks_.push_back(c.chunk), sums_.push_back(0.0);
                sums_.back() += c.s;
            }
            for (size_t i = 0; i < chunks_.size(); ++i) sums_[i] /= double(std::min(C_, P_ - chunks_[i] * C_));
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t j = 0; j < T; ++j) {
                    const int64_t r = b * G_ + g;
                    const int32_t p = pos_[size_t(r * L_ + j)];
                    if (p < 0) continue;
                    const size_t i = size_t(std::lower_bound(chunks_.begin(), chunks_.end(), p / C_) - chunks_.begin());
                    score(r, j) = float(sums_[i]);
                }
        }
    }

   private:
    struct Cell {
        int64_t chunk;
        double s;
    };
    int64_t C_;
    SnapKVVotes votes_;
    std::vector<float> tok_;  // scratch: SnapKV's score per slot (B*G, L)
    std::vector<Cell> cells_;
    std::vector<int64_t> chunks_;
    std::vector<double> sums_;
};
}  // namespace

std::vector<PolicyInfo> chunkkv_policies() {
    return {{.name = "chunkkv",
             .summary = "ChunkKV: SnapKV scores averaged over chunks of chunkkv_chunk_size positions; whole chunks kept or evicted",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<ChunkKVPolicy>(a.cfg, a.L, a.G); },
             .needs_attention_weights = true,
             .uses = {"snapkv_window", "snapkv_kernel", "grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "chunkkv_chunk_size",
                          .help = "chunkkv: consecutive token positions scored, kept and evicted together",
                          .def = 10,
                          .lo = 1,
                          .hi = 1 << 20,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#chunkkv"}};
}

}  // namespace kv
