// compactor (Compactor, Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache
// Compression with Approximate Leverage Scores"; as kvpress' CompactorPress): blends the two
// query-agnostic views of a token, its key's leverage (policy_leverage.h) and the non-causal
// tile attention it receives (policy_non_causal_attn.h). After every chunk ending at P, over
// the cached tokens outside the protected ends (the first compactor_sinks_start positions and
// the compactor_sinks_end newest):
//   score_j = b z(leverage)_j + z(pool3(A |v|))_j,   b = compactor_blending, or when that is
//   negative (default) the fraction of the sequence evicted so far, 1 - T / P (kvpress: the
//   compression ratio); the protected tokens take the layer's maximum + 1.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/kv/policies/policy_leverage.h"
#include "engine/kv/policies/policy_non_causal_attn.h"
#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/position_order.h"

namespace kv {

namespace {
class CompactorPolicy final : public ScorePolicy {
   public:
    CompactorPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer)
        : ScorePolicy(cfg, L, G),
          tiles_(int64_t(cfg.policy_option("nca_chunk_size"))),
          layer_(layer),
          blending_(cfg.policy_option("compactor_blending")),
          first_(int64_t(cfg.policy_option("compactor_sinks_start"))),
          last_(int64_t(cfg.policy_option("compactor_sinks_end"))) {
        sketch_.k = int64_t(cfg.policy_option("leverage_sketch"));
    }
    const char* name() const override { return "compactor"; }
    FeatureSet needs_features() const override { return {Feature::QueryVectors, Feature::KeyVectors, Feature::ValueNorm}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        raw_.assign(size_t(rows() * L_), 0.0);
        score_.assign(size_t(rows() * L_), 0.0f);
        proj_.clear();
        D_ = 0;
        tiles_.reset();
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        ScorePolicy::prefill(n, f);
        sketch_.flush(D_, G_, L_, proj_.data());  // the chunk's keys projected together (LeverageSketch::flush)
        tiles_.observe(f, 0, n, B_, G_, pos_, L_, T_, raw_, T_ == L_);
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        ScorePolicy::apply(plan, f);
        sketch_.flush(D_, G_, L_, proj_.data());
        tiles_.observe(f, plan.input_pos, plan.n, B_, G_, pos_, L_, T_, raw_, T_ == L_);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) {
            D_ = f.head_dim;
            K_ = sketch_.width(D_);
            proj_.assign(size_t(rows() * L_ * K_), 0.0);
            sketch_.init(layer_, G_, D_);
        }
        raw_[size_t(r * L_ + slot)] = 0.0;
        score_[size_t(r * L_ + slot)] = 0.0f;
        sketch_.stage(f.keys.data() + i * D_, D_, f.rope_inv_freq, double(pos_[size_t(r * L_ + slot)]), r, slot);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        raw_[size_t(r * L_ + to)] = raw_[size_t(r * L_ + from)];
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(proj_.begin() + (r * L_ + from) * K_, K_, proj_.begin() + (r * L_ + to) * K_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        if (T_ < L_) return;  // scores are read only from a full cache (choose_next, slot_scores), each time recomputed
        // kvpress keeps min(first, S) sinks and min(last, S - sinks) newest tokens out of both scores
        const int64_t left = std::min(first_, P_), right = std::min(last_, std::max<int64_t>(0, P_ - left));
        std::vector<std::vector<int32_t>>& idx = idx_;
        idx.resize((size_t)rows());
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            std::vector<int32_t>& o = idx[size_t(r)];
            slots_by_position(pos, T_, o, table_);
            o.erase(std::remove_if(o.begin(), o.end(), [&](int32_t j) { return pos[j] < left || pos[j] >= P_ - right; }), o.end());
        }
        std::vector<double>&att = att_, &lev = lev_;
        lev.clear();
        pool3(raw_, L_, idx, att);
        z_normalise(att);
        for (int64_t r = 0; r < rows(); ++r) {
            const size_t at = lev.size();
            lev.resize(at + idx[size_t(r)].size());
            if (!idx[size_t(r)].empty())
                sketch_.leverage(proj_.data() + r * L_ * K_, idx[size_t(r)].data(), int64_t(idx[size_t(r)].size()), K_, lev.data() + at);
        }
        z_normalise(lev);
        const double b = blending_ >= 0 ? blending_ : std::max(0.0, 1.0 - double(T_) / double(P_));
        double top = -INFINITY;
        for (size_t i = 0; i < att.size(); ++i) top = std::max(top, att[i] += b * lev[i]);
        if (att.empty()) top = 0;
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T_; ++j) score_[size_t(r * L_ + j)] = float(top + 1);  // protected unless listed below
        size_t i = 0;
        for (int64_t r = 0; r < rows(); ++r)
            for (int32_t j : idx[size_t(r)]) score_[size_t(r * L_ + j)] = float(att[i++]);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    NonCausalTiles tiles_;
    LeverageSketch sketch_;
    int64_t layer_, D_ = 0, K_ = 0;
    double blending_;
    int64_t first_, last_;
    std::vector<double> raw_;   // (B*G, L) A_j |v_j|
    std::vector<float> score_;  // (B*G, L)
    std::vector<double> proj_;  // (B*G, L, K) pre-RoPE keys times the sketch (LeverageSketch::flush)
    std::vector<std::vector<int32_t>> idx_;  // scratch of accumulate, kept (no allocation per chunk)
    std::vector<int32_t> table_;
    std::vector<double> att_, lev_;
};
}  // namespace

std::vector<PolicyInfo> compactor_policies() {
    return {{.name = "compactor",
             .summary = "Compactor: key leverage blended with non-causal tile attention (sinks and newest tokens kept)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<CompactorPolicy>(a.cfg, a.L, a.G, a.layer);
             },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "compactor_blending",
                          .help = "compactor: weight of the leverage (negative: the fraction of the sequence evicted so far)",
                          .def = -1,
                          .lo = -1,
                          .hi = 1000,
                          .integer = false},
                         {.name = "compactor_sinks_start", .help = "compactor: first positions always kept", .def = 8, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "compactor_sinks_end", .help = "compactor: newest tokens always kept", .def = 4, .lo = 0, .hi = 1 << 20, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#compactor"}};
}

}  // namespace kv
