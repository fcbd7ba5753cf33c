// qfilter (Q-Filters, Godey et al. 2025, "Q-Filters: Leveraging QK Geometry for Efficient KV
// Cache Compression"; kvpress' QFilterPress): queries and keys of a head share one dominant
// direction, so the attention a key receives on average follows its projection on it. Each
// (layer, KV head) has a filter f, the main direction of its post-RoPE queries signed so that
// the mean query projects positively (qfilter_filters.h, `kvlab calibrate qfilter`); a slot's
// score is its rotated key's projection, fixed when the token enters:
//   score_j = <k_j, f>    (low: little expected attention, evicted first)
// kvpress writes -<k, f_hub> with the published filters, which point the other way. Needs no
// attention weights and no queries at run time.
#include <memory>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/qfilter_filters.h"

namespace kv {

namespace {
class QFilterPolicy final : public SlotScorePolicy {
   public:
    QFilterPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer) : SlotScorePolicy(cfg, L, G), option_(cfg.qfilter) {
        // The whole model's shape is checked by validate_qfilter; a layer checks its own part.
        const bool axis = cfg.qfilter.rfind("axis:", 0) == 0;
        const QFilters f = axis || cfg.qfilter.empty() ? qfilters_for_model(cfg.qfilter, 1, G) : read_qfilters(cfg.qfilter);
        axis_ = f.axis;
        if (axis_ >= 0) return;
        if (f.kv_heads != G || layer >= f.layers)
            throw Error(str("--kv_cache.qfilter: '", cfg.qfilter, "' has filters for ", f.layers, " layers x ", f.kv_heads, " KV heads; layer ",
                            layer, " has ", G, " KV heads"),
                        "calibrate the filters for this model: kvlab calibrate qfilter MODEL --data FILE -o FILE");
        D_ = f.head_dim;
        filter_.assign(f.filter(layer, 0), f.filter(layer, 0) + G * D_);
    }
    const char* name() const override { return "qfilter"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors}; }

   protected:
    float initial_score(const InsertFeatures& f, int64_t i) const override {
        const int64_t D = f.head_dim;
        if (axis_ >= 0) {
            if (axis_ >= D) throw Error(str("--kv_cache.qfilter: '", option_, "' names channel ", axis_, "; the heads have ", D, " channels"));
        } else if (D != D_) {
            throw Error(str("--kv_cache.qfilter: '", option_, "' has filters of ", D_, " channels; this model's heads have ", D,
                            "; calibrate the filters for this model: kvlab calibrate qfilter MODEL --data FILE -o FILE"));
        }
        const int64_t n = int64_t(f.keys.size()) / (rows() * D);  // features are (B, G, n, D)
        const int64_t g = (i / n) % G_;
        const float* k = f.keys.data() + i * D;
        if (axis_ >= 0) return k[axis_];
        const double* fv = filter_.data() + g * D;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(k[d]) * fv[d];
        return float(dot);
    }

   private:
    std::string option_;
    int64_t D_ = 0, axis_ = -1;
    std::vector<double> filter_;  // (G, D) this layer's filters
};

void validate_qfilter(const KVCacheConfig& cfg, int64_t num_layers, int64_t num_kv_heads) {
    if (num_layers > 0 && num_kv_heads > 0) (void)qfilters_for_model(cfg.qfilter, num_layers, num_kv_heads);
    else if (cfg.qfilter.empty() || cfg.qfilter.rfind("axis:", 0) == 0) (void)qfilters_for_model(cfg.qfilter, 1, 1);
    else (void)read_qfilters(cfg.qfilter);
}
}  // namespace

std::vector<PolicyInfo> qfilter_policies() {
    return {{.name = "qfilter",
             .summary = "Q-Filters: keys scored by their projection on the main direction of their head's queries (--kv_cache.qfilter)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<QFilterPolicy>(a.cfg, a.L, a.G, a.layer); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size", "qfilter"},
             .required = {{"kv_cache.qfilter", "axis:0"}},
             .doc_anchor = "docs/POLICIES.md#qfilter",
             .validate = validate_qfilter}};
}

}  // namespace kv
