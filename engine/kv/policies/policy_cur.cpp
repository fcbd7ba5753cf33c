// cur (CurDKV, Sengupta et al. 2025, "Value-Guided KV Compression for LLMs via Approximated
// CUR Decomposition"; as kvpress' CURPress with its defaults): a token's leverage is
// approximated by its key's and value's squared norms, each normalised within a local window
// of cur_window positions, and combined by cur_leverage (product by default):
//   k2_j = |k_j|^2 / sum over the cached tokens j' of j's window of |k_j'|^2   (v2_j alike)
//   s_j  = k2_j v2_j (or k2, v2, (k2 + v2) / 2), divided by its sum over the row;
//   the first cur_num_sinks positions score 1 (kept).
// Recomputed after every chunk over the cached slots; needs no attention weights. The norms are
// taken when a token is written (before quantization).
#include <algorithm>
#include <numeric>

#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class CURPolicy final : public ScorePolicy {
   public:
    CURPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          sinks_(int64_t(cfg.policy_option("cur_num_sinks"))),
          window_(int64_t(cfg.policy_option("cur_window"))),
          kind_(int(cfg.policy_option("cur_leverage"))) {}
    const char* name() const override { return "cur"; }
    FeatureSet needs_features() const override { return {Feature::KeyNorm, Feature::ValueNorm}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        k2_.assign(size_t(rows() * L_), 0.0);
        v2_.assign(size_t(rows() * L_), 0.0);
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        const size_t s = size_t(r * L_ + slot);
        score_[s] = 0.0f;
        const double k = f.key_norm.empty() ? 0.0 : double(f.key_norm[size_t(i)]), v = f.value_norm.empty() ? 0.0 : double(f.value_norm[size_t(i)]);
        k2_[s] = k * k;
        v2_[s] = v * v;
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        const size_t a = size_t(r * L_ + from), b = size_t(r * L_ + to);
        score_[b] = score_[a], k2_[b] = k2_[a], v2_[b] = v2_[a];
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        const int64_t T = T_;
        order_.resize(size_t(T));
        lev_.resize(size_t(T));
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            const double* k2 = k2_.data() + r * L_;
            const double* v2 = v2_.data() + r * L_;
            std::iota(order_.begin(), order_.end(), 0);
            std::sort(order_.begin(), order_.end(), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
            double total = 0;
            for (int64_t i = 0; i < T;) {  // one local window of positions at a time
                int64_t e = i + 1;
                if (window_ > 0)
                    while (e < T && pos[order_[size_t(e)]] / window_ == pos[order_[size_t(i)]] / window_) ++e;
                else
                    e = T;
                double ks = 0, vs = 0;
                for (int64_t m = i; m < e; ++m) ks += k2[order_[size_t(m)]], vs += v2[order_[size_t(m)]];
                for (int64_t m = i; m < e; ++m) {
                    const int32_t j = order_[size_t(m)];
                    const double kn = window_ > 0 ? k2[j] / ks : k2[j], vn = window_ > 0 ? v2[j] / vs : v2[j];
                    const double s = kind_ == 0 ? kn : kind_ == 1 ? vn : kind_ == 2 ? (kn + vn) / 2 : kn * vn;
                    total += (lev_[size_t(j)] = s);
                }
                i = e;
            }
            for (int64_t j = 0; j < T; ++j)
                score_[size_t(r * L_ + j)] = pos[j] < sinks_ ? 1.0f : float(lev_[size_t(j)] / total);
        }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t sinks_, window_;
    int kind_;                    // 0 key, 1 value, 2 mean, 3 product
    std::vector<float> score_;    // (B*G, L)
    std::vector<double> k2_, v2_;  // (B*G, L) squared key and value norms
    std::vector<int32_t> order_;  // scratch: one row's slots in position order
    std::vector<double> lev_;     // scratch: one row's leverages
};
}  // namespace

std::vector<PolicyInfo> cur_policies() {
    return {{.name = "cur",
             .summary = "CUR (CurDKV): key and value leverage from squared norms normalised in local windows (no attention weights needed)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CURPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "cur_num_sinks", .help = "cur: first positions always kept (score 1)", .def = 4, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "cur_window", .help = "cur: positions per local normalisation window (0: none)", .def = 16, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "cur_leverage", .help = "cur: 0 key, 1 value, 2 mean of both, 3 product of both", .def = 3, .lo = 0, .hi = 3, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#cur"}};
}

}  // namespace kv
