// kvzap (KVzap, arXiv 2601.07891, 2026; kvpress' KVzapPress): KVzip's scores without its second
// pass. A small surrogate per (layer, KV head), fitted by `kvlab calibrate kvzap` on the
// model's own KVzip scores (engine/kv/kvzap_calibration.h), predicts the log of the score a
// token would get from the hidden state the layer's q/k/v projections read (the attention input
// after its norm, h (E)); a slot's score is that prediction, fixed when the token enters:
//   score_j = w_g . h_j + b_g      (low: evicted first)
// Eviction is the score-based rule (lowest per (b, g) row, grace ring, keep-initial), and the
// compress-then-ask threshold budget (--kv_cache.score_threshold, kvpress' DMSPress) applies to
// the predictions as it does to any slot score. docs/POLICIES.md#kvzap.
#include <memory>

#include "engine/core/error.h"
#include "engine/kv/policies/kvzap_weights.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class KVzapPolicy final : public SlotScorePolicy {
   public:
    KVzapPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer) : SlotScorePolicy(cfg, L, G), option_(cfg.kvzap), layer_(layer) {
        // The whole model's shape is checked by validate_kvzap; a layer checks its own part.
        const bool seeded = cfg.kvzap.rfind("seed:", 0) == 0;
        const KVzapWeights w = seeded || cfg.kvzap.empty() ? kvzap_weights_for_model(cfg.kvzap, 1, G) : read_kvzap_weights(cfg.kvzap);
        seed_ = w.seed;
        if (seed_ >= 0) return;
        if (w.kv_heads != G || layer >= w.layers)
            throw Error(str("--kv_cache.kvzap: '", cfg.kvzap, "' has a surrogate for ", w.layers, " layers x ", w.kv_heads,
                            " KV heads; layer ", layer, " has ", G, " KV heads"),
                        "calibrate the surrogate for this model: kvlab calibrate kvzap MODEL --data FILE -o FILE");
        E_ = w.hidden_size;
        rows_.assign(w.row(layer, 0), w.row(layer, 0) + G * (E_ + 1));
    }
    const char* name() const override { return "kvzap"; }
    FeatureSet needs_features() const override { return {Feature::HiddenStates}; }

   protected:
    float initial_score(const InsertFeatures& f, int64_t i) const override {
        const int64_t E = f.hidden_size;
        if (seed_ >= 0 && E_ != E) {  // seeded rows are drawn once the hidden size is known
            E_ = E;
            rows_.clear();
            for (int64_t g = 0; g < G_; ++g) {
                const std::vector<double> r = seeded_kvzap_row(seed_, layer_, g, E);
                rows_.insert(rows_.end(), r.begin(), r.end());
            }
        } else if (E != E_) {
            throw Error(str("--kv_cache.kvzap: '", option_, "' has a surrogate for hidden size ", E_, "; this model's layers have ", E),
                        "calibrate the surrogate for this model: kvlab calibrate kvzap MODEL --data FILE -o FILE");
        }
        // Features index i = (b G + g) n + t; the hidden states are (B, n, E).
        const int64_t n = int64_t(f.hidden.size()) / (batch() * E), r = i / n, t = i % n, b = r / G_, g = r % G_;
        const float* h = f.hidden.data() + (b * n + t) * E;
        const double* w = rows_.data() + g * (E + 1);
        double s = w[E];
        for (int64_t e = 0; e < E; ++e) s += w[e] * double(h[e]);
        return float(s);
    }

   private:
    std::string option_;
    int64_t layer_, seed_ = -1;
    // (G, E + 1) this layer's weights and biases; "seed:N" draws them at the first hidden states.
    mutable int64_t E_ = 0;
    mutable std::vector<double> rows_;
};

void validate_kvzap(const KVCacheConfig& cfg, int64_t num_layers, int64_t num_kv_heads) {
    if (num_layers > 0 && num_kv_heads > 0) (void)kvzap_weights_for_model(cfg.kvzap, num_layers, num_kv_heads);
    else if (cfg.kvzap.empty() || cfg.kvzap.rfind("seed:", 0) == 0) (void)kvzap_weights_for_model(cfg.kvzap, 1, 1);
    else (void)read_kvzap_weights(cfg.kvzap);
}
}  // namespace

std::vector<PolicyInfo> kvzap_policies() {
    return {{.name = "kvzap",
             .summary = "KVzap: a linear surrogate of KVzip's log score from each token's hidden state (--kv_cache.kvzap)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<KVzapPolicy>(a.cfg, a.L, a.G, a.layer); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size", "kvzap"},
             .required = {{"kv_cache.kvzap", "seed:1"}},
             .doc_anchor = "docs/POLICIES.md#kvzap",
             .validate = validate_kvzap}};
}

}  // namespace kv
