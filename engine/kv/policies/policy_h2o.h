// H2O family scorers (reference §4.6, §4.7), declared here so qh2o can build on them:
// h2o accumulates the attention a slot receives per (b, g) row (optionally divided by the
// token's age); h2o-orig sums the increment over the batch (identical decisions per row, no
// normalisation); h2o-vlen accumulates n * w_j |v_j| / sum_k w_k |v_k| instead of w_j.
#pragma once

#include <algorithm>

#include "engine/kv/policies/policy_score_based.h"

namespace kv {

class H2OPolicy : public ScorePolicy {
   public:
    enum class Kind { H2O, ORIG, VLEN };
    H2OPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, Kind kind)
        : ScorePolicy(cfg, L, G), kind_(kind), normalize_(cfg.normalize_scores && kind != Kind::ORIG) {}
    const char* name() const override { return kind_ == Kind::H2O ? "h2o" : kind_ == Kind::ORIG ? "h2o-orig" : "h2o-vlen"; }
    bool needs_attention_weights() const override { return true; }
    FeatureSet needs_features() const override { return kind_ == Kind::VLEN ? FeatureSet(Feature::ValueNorm) : FeatureSet(); }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        vnorm_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        score_[size_t(r * L_ + slot)] = 0.0f;
        if (kind_ == Kind::VLEN) vnorm_[size_t(r * L_ + slot)] = f.value_norm.empty() ? 1.0f : f.value_norm[size_t(i)];
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        vnorm_[size_t(r * L_ + to)] = vnorm_[size_t(r * L_ + from)];
    }
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (w.empty()) return;
        const int64_t T = T_;
        if (kind_ == Kind::ORIG) {  // one increment, summed over the batch, for every row
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t j = 0; j < T; ++j) {
                    float s = 0;
                    for (int64_t b = 0; b < B_; ++b) s += w[size_t((b * G_ + g) * T + j)];
                    for (int64_t b = 0; b < B_; ++b) score_[size_t((b * G_ + g) * L_ + j)] += s;
                }
            return;
        }
        for (int64_t r = 0; r < rows(); ++r) {
            const float* wr = w.data() + r * T;
            float* sr = score_.data() + r * L_;
            if (kind_ == Kind::H2O) {
                for (int64_t j = 0; j < T; ++j) sr[j] += wr[j];
            } else {  // s_j = n * w_j |v_j| / sum_k w_k |v_k|
                const float* vn = vnorm_.data() + r * L_;
                double denom = 0;
                for (int64_t j = 0; j < T; ++j) denom += double(wr[j]) * double(vn[j]);
                if (denom > 0)
                    for (int64_t j = 0; j < T; ++j) sr[j] += float(double(n) * double(wr[j]) * double(vn[j]) / denom);
            }
        }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) {
                float s = score_[size_t(r * L_ + j)];
                if (normalize_) {  // divide by the steps the token has been attended to
                    const int32_t tp = pos_[size_t(r * L_ + j)];
                    const int64_t age = P_ - std::max<int64_t>(tp, prefill_length_ - 1);
                    s = age > 0 ? s / float(age) : s;
                }
                S[size_t(r * cand + j)] = s;
            }
    }

   public:
    // For qh2o: the (optionally normalised) h2o score of row r, slot j.
    const std::vector<float>& raw_scores() const { return score_; }

   protected:
    Kind kind_;
    bool normalize_;
    std::vector<float> score_;  // (B*G, L) accumulated attention
    std::vector<float> vnorm_;  // (B*G, L) value norms (vlen)
};

}  // namespace kv
