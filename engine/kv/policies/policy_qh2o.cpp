// qh2o / qh2o-vlen (reference §4.8, §4.9; Q-Hitter style, quantized buffers only): a slot's
// score combines its (optionally normalised) H2O score with its quantization error, each
// min-max normalised over all (g, j) of the batch row:
//   S = c mm(h2o) + ((c - 1) / 2) mm(qerr) + (1 - c),   mm(x) = (x - min) / (max - min)
// so a large quantization error lowers the score. Deliberate differences from keys_values:
// max = min gives mm = 0 (not NaN), and qh2o-vlen really uses the value-norm score (keys_values'
// method resolution order silently made it qh2o).
#include <cmath>

#include "engine/kv/policies/policy_h2o.h"

namespace kv {

namespace {

class QH2OPolicy final : public H2OPolicy {
   public:
    QH2OPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, bool vlen)
        : H2OPolicy(cfg, L, G, vlen ? Kind::VLEN : Kind::H2O), c_(float(cfg.combination_constant)), vlen_(vlen) {}
    const char* name() const override { return vlen_ ? "qh2o-vlen" : "qh2o"; }
    FeatureSet needs_features() const override { return {Feature::QuantError}; }
    void reset(int64_t batch) override {
        H2OPolicy::reset(batch);
        qerr_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        H2OPolicy::init_slot(r, slot, f, i);
        qerr_[size_t(r * L_ + slot)] = f.quant_error.empty() ? 0.0f : f.quant_error[size_t(i)];
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        H2OPolicy::move_slot(r, from, to);
        qerr_[size_t(r * L_ + to)] = qerr_[size_t(r * L_ + from)];
    }
    void eviction_scores(std::vector<float>& S) const override {
        H2OPolicy::eviction_scores(S);  // the h2o part, (B*G, L - grace)
        const int64_t cand = L_ - grace();
        for (int64_t b = 0; b < B_; ++b) {
            // min/max over every (g, j) of batch row b jointly
            float hmin = INFINITY, hmax = -INFINITY, qmin = INFINITY, qmax = -INFINITY;
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t j = 0; j < cand; ++j) {
                    const float h = S[size_t((b * G_ + g) * cand + j)], q = qerr_[size_t((b * G_ + g) * L_ + j)];
                    hmin = std::min(hmin, h), hmax = std::max(hmax, h), qmin = std::min(qmin, q), qmax = std::max(qmax, q);
                }
            const float hr = hmax - hmin, qr = qmax - qmin;
            for (int64_t g = 0; g < G_; ++g)
                for (int64_t j = 0; j < cand; ++j) {
                    float& s = S[size_t((b * G_ + g) * cand + j)];
                    const float mh = hr > 0 ? (s - hmin) / hr : 0.0f;
                    const float mq = qr > 0 ? (qerr_[size_t((b * G_ + g) * L_ + j)] - qmin) / qr : 0.0f;
                    s = c_ * mh + (c_ - 1.0f) / 2.0f * mq + (1.0f - c_);
                }
        }
    }

   private:
    float c_;
    bool vlen_;
    std::vector<float> qerr_;  // (B*G, L)
};

}  // namespace

std::vector<PolicyInfo> qh2o_policies() {
    const std::vector<std::string> uses = {"combination_constant", "grace_period", "keep_initial_fraction", "max_chunk_size",
                                           "normalize_scores"};
    return {{.name = "qh2o",
             .summary = "Q-Hitter style: min-max mix of the H2O score and the quantization error (quantized buffers)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<QH2OPolicy>(a.cfg, a.L, a.G, false); },
             .needs_attention_weights = true,
             .needs_quantized_buffer = true,
             .uses = uses,
             .doc_anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row"},
            {.name = "qh2o-vlen",
             .summary = "qh2o with the h2o-vlen score inside (quantized buffers)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<QH2OPolicy>(a.cfg, a.L, a.G, true); },
             .needs_attention_weights = true,
             .needs_quantized_buffer = true,
             .uses = uses,
             .doc_anchor = "docs/POLICIES.md#score-policies-decisions-per-b-g-row"}};
}

}  // namespace kv
