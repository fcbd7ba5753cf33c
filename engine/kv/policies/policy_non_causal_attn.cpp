// non-causal-attn (kvpress' NonCausalAttnPress, the attention half of Compactor: Chari & Van
// Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate
// Leverage Scores"): the sequence is cut into tiles of nca_chunk_size positions; inside a tile
// every query attends to every key of the tile, non-causally and unscaled (the official
// implementation's sm_scale 1). A token's score is the attention its tile's queries pay it
// (summed over queries, averaged over the group's heads) times its value norm, average-pooled
// over 3 neighbouring positions (zero padding counted) and z-normalised over the layer:
//   A_j = mean_h sum_{i in tile(j)} softmax_{k in tile(j)}(q_i . k_k)[j],   a_j = A_j |v_j|
//   s_j = (a_{j-1} + a_j + a_{j+1}) / 3,    score_j = (s_j - mean s) / max(std s, 1e-6)
// Tiles fill as the sequence arrives: the newest tile is rescored over its queries and keys
// so far at every call (its queries and keys are kept until it is complete); a complete tile's
// A is final. Needs the chunk's queries and keys, not the attention weights.
#include "engine/kv/policies/policy_non_causal_attn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/kv/policies/policy_leverage.h"  // z_normalise
#include "engine/kv/policies/policy_fma_math.h"
#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/position_order.h"

namespace kv {

void NonCausalTiles::observe(const InsertFeatures& f, int64_t P, int64_t n, int64_t B, int64_t G, const std::vector<int32_t>& pos,
                             int64_t L, int64_t T, std::vector<double>& raw, bool read) {
    const int64_t rows = B * G;
    if (D_ == 0) {
        D_ = f.head_dim;
        NH_ = f.query_heads > 0 ? f.query_heads : G;
        q_.assign(size_t(B * NH_ * C_ * D_), 0.0f);
        k_.assign(size_t(rows * C_ * D_), 0.0f);
        vn_.assign(size_t(rows * C_), 0.0f);
        hasq_.assign(size_t(C_), 0);
    }
    for (int64_t t = 0; t < n; ++t) {
        const int64_t p = P + t;
        if (p >= tile_start_ + C_) {  // the open tile is complete: its scores are final
            tile_start_ += C_ * ((p - tile_start_) / C_);
            m_ = 0;
            std::fill(hasq_.begin(), hasq_.end(), 0);
        }
        const int64_t i = p - tile_start_;
        for (int64_t r = 0; r < rows; ++r) {
            // transposed as written (D, C) per row: the tile's products read the keys as columns
            const float* key = f.keys.data() + (r * n + t) * D_;
            for (int64_t x = 0; x < D_; ++x) k_[size_t((r * D_ + x) * C_ + i)] = key[x];
            vn_[size_t(r * C_ + i)] = f.value_norm.empty() ? 0.0f : f.value_norm[size_t(r * n + t)];
        }
        if (!f.queries.empty()) {
            for (int64_t bh = 0; bh < B * NH_; ++bh)
                std::copy_n(f.queries.begin() + (bh * n + t) * D_, D_, q_.begin() + (bh * C_ + i) * D_);
            hasq_[size_t(i)] = 1;
        }
        m_ = i + 1;
        // a complete tile is scored once, for good; the open one only when its scores are read
        if (p + 1 == tile_start_ + C_ || (p + 1 == P + n && read)) score_tile(B, G, pos, L, T, raw);
    }
}

void NonCausalTiles::score_tile(int64_t B, int64_t G, const std::vector<int32_t>& pos, int64_t L, int64_t T,
                                std::vector<double>& raw) {
    const int64_t R = NH_ / G, m = m_;
    std::vector<double>&A = A_, &acc = acc_;
    std::vector<float>& strip = strip_;
    A.resize(size_t(m)), acc.resize(size_t(m)), strip.resize(size_t(8 * m));
    for (int64_t r = 0; r < B * G; ++r) {
        const int64_t b = r / G, g = r % G;
        std::fill(A.begin(), A.end(), 0.0);
        // per head, every query of the tile against every key: f32 products with fused
        // multiply-adds, then each query's row exponentiated in f32 at the CPU's vector width and
        // the weights' column sums as f32 multiply-adds over blocks of 8 queries added in f64, a
        // strip of 8 queries at a time (policy_fma_math.h: well inside the scores' tolerance); a
        // prefill without attention has no queries (rows skipped)
        for (int64_t h = g * R; h < (g + 1) * R; ++h)
            policy_tile_attention_colsum(q_.data() + (b * NH_ + h) * C_ * D_, D_, k_.data() + r * D_ * C_, C_, m, m, D_, hasq_.data(), double(R),
                                         A.data(), strip.data(), acc.data());
        for (int64_t s = 0; s < T; ++s) {
            const int64_t i = pos[size_t(r * L + s)] - tile_start_;
            if (i >= 0 && i < m) raw[size_t(r * L + s)] = A[size_t(i)] * double(vn_[size_t(r * C_ + i)]);
        }
    }
}

void pool3(const std::vector<double>& v, int64_t L, const std::vector<std::vector<int32_t>>& idx, std::vector<double>& out) {
    out.clear();
    for (size_t r = 0; r < idx.size(); ++r) {
        const std::vector<int32_t>& o = idx[r];
        const int64_t m = int64_t(o.size());
        for (int64_t i = 0; i < m; ++i) {
            double acc = 0;
            for (int64_t k = std::max<int64_t>(0, i - 1); k <= std::min(m - 1, i + 1); ++k) acc += v[size_t(int64_t(r) * L + o[size_t(k)])];
            out.push_back(acc / 3.0);
        }
    }
}

namespace {
class NonCausalAttnPolicy final : public ScorePolicy {
   public:
    NonCausalAttnPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G), tiles_(int64_t(cfg.policy_option("nca_chunk_size"))) {}
    const char* name() const override { return "non-causal-attn"; }
    FeatureSet needs_features() const override { return {Feature::QueryVectors, Feature::KeyVectors, Feature::ValueNorm}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        raw_.assign(size_t(rows() * L_), 0.0);
        score_.assign(size_t(rows() * L_), 0.0f);
        tiles_.reset();
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        ScorePolicy::prefill(n, f);
        tiles_.observe(f, 0, n, B_, G_, pos_, L_, T_, raw_, T_ == L_);
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        ScorePolicy::apply(plan, f);
        tiles_.observe(f, plan.input_pos, plan.n, B_, G_, pos_, L_, T_, raw_, T_ == L_);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures&, int64_t) override { raw_[size_t(r * L_ + slot)] = 0.0; }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        raw_[size_t(r * L_ + to)] = raw_[size_t(r * L_ + from)];
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        if (T_ < L_) return;  // scores are read only from a full cache (choose_next, slot_scores), each time recomputed
        // pool a in position order per row, then z-normalise over every cached token of the layer
        std::vector<std::vector<int32_t>>& idx = idx_;
        idx.resize((size_t)rows());
        for (int64_t r = 0; r < rows(); ++r) slots_by_position(pos_.data() + r * L_, T_, idx[size_t(r)], table_);
        std::vector<double>& s = s_;
        pool3(raw_, L_, idx, s);
        z_normalise(s);
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t i = 0; i < T_; ++i) score_[size_t(r * L_ + idx[size_t(r)][size_t(i)])] = float(s[size_t(r * T_ + i)]);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    NonCausalTiles tiles_;
    std::vector<double> raw_;   // (B*G, L) a_j
    std::vector<float> score_;  // (B*G, L)
    std::vector<std::vector<int32_t>> idx_;  // scratch of accumulate, kept (no allocation per chunk)
    std::vector<int32_t> table_;
    std::vector<double> s_;
};
}  // namespace

std::vector<PolicyInfo> non_causal_attn_policies() {
    return {{.name = "non-causal-attn",
             .summary = "NonCausalAttn: non-causal attention inside tiles of nca_chunk_size positions, times |v|, pooled, z-normalised",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<NonCausalAttnPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "nca_chunk_size", .help = "non-causal-attn: positions per tile of non-causal attention", .def = 256, .lo = 1, .hi = 1 << 16, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#non-causal-attn"}};
}

}  // namespace kv
