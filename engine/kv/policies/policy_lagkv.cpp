// lagkv (LagKV, Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which
// Tokens Are Important"; as kvpress' LagKVPress): query-free. The cached tokens, in position
// order, are cut after lagkv_sinks sinks into blocks of lagkv_lag tokens; a block's tokens are
// scored against the per-channel min/max of the block after it (its "lag" reference):
//   s_j(X) = std_d((x_jd - min_d ref) / (max_d ref - min_d ref)),   softmax over the block
//   score_j = rank of (s_j(K) + s_j(V)) / 2 within its block / lagkv_lag   (lagkv_cross: the
//   mean itself, comparable across blocks)
// The sinks and the last full block with the remainder (no reference yet) score 1; a sequence
// shorter than sinks + 2 blocks scores its non-sink tokens by age, (i - sinks) / (m - sinks).
// Recomputed after every chunk over the cached tokens; keys and values are kept per slot.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/position_order.h"

namespace kv {

namespace {
class LagKVPolicy final : public ScorePolicy {
   public:
    LagKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          sinks_(int64_t(cfg.policy_option("lagkv_sinks"))),
          lag_(int64_t(cfg.policy_option("lagkv_lag"))),
          cross_(cfg.policy_option("lagkv_cross") != 0) {}
    const char* name() const override { return "lagkv"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::ValueVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        kv_.clear();
        D_ = 0;
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) {
            D_ = f.head_dim;
            kv_.assign(size_t(rows() * L_ * 2 * D_), 0.0f);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        float* dst = kv_.data() + (r * L_ + slot) * 2 * D_;
        std::copy_n(f.keys.data() + i * D_, D_, dst);
        // a buffer that gave no values (never for a live run) leaves them 0: the key half decides
        if (f.values.size() >= size_t((i + 1) * D_)) std::copy_n(f.values.data() + i * D_, D_, dst + D_);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(kv_.begin() + (r * L_ + from) * 2 * D_, 2 * D_, kv_.begin() + (r * L_ + to) * 2 * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        const int64_t m = T_;
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            float* out = score_.data() + r * L_;
            slots_by_position(pos, m, order_, by_pos_);
            for (int64_t i = 0; i < m; ++i) out[order_[size_t(i)]] = 1.0f;
            if (m < sinks_ + 2 * lag_) {  // too short to score: keep the newest (kvpress' fallback)
                for (int64_t i = sinks_; i < m; ++i) out[order_[size_t(i)]] = float(double(i - sinks_) / double(m - sinks_));
                continue;
            }
            const int64_t blocks = (m - sinks_) / lag_ - 1;  // the last full block is the final reference
            for (int64_t b = 0; b < blocks; ++b) score_block(r, sinks_ + b * lag_, out);
        }
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    static constexpr int64_t kGroup = 8;
    // Scores of the block order_[at, at + lag) of row r against the block after it.
    void score_block(int64_t r, int64_t at, float* out) {
        mix_.assign(size_t(lag_), 0.0);
        for (int64_t half = 0; half < 2; ++half) {  // keys, then values
            auto row = [&](int64_t i) { return kv_.data() + (r * L_ + order_[size_t(i)]) * 2 * D_ + half * D_; };
            lo_.assign(size_t(D_), INFINITY);
            hi_.assign(size_t(D_), -INFINITY);
            for (int64_t i = at + lag_; i < at + 2 * lag_; ++i) {
                const float* x = row(i);
                for (int64_t d = 0; d < D_; ++d)
                    lo_[size_t(d)] = std::min(lo_[size_t(d)], double(x[d])), hi_[size_t(d)] = std::max(hi_[size_t(d)], double(x[d]));
            }
            // (x - min) / (max - min) of each channel of the reference; a flat channel (kvpress:
            // NaN) counts its range as 1. Each normalised value once per token, then its mean and
            // unbiased std (torch's) in channel order.
            range_.resize(size_t(D_));
            for (int64_t d = 0; d < D_; ++d) {
                const double range = hi_[size_t(d)] - lo_[size_t(d)];
                range_[size_t(d)] = range > 0 ? range : 1.0;
            }
            // Each token's normalised channels, mean and std, as one token at a time would sum
            // them (channel order, one dependent chain per token), for kGroup tokens at once so
            // the chains overlap. Dividing by D is a product with 1 / D when that is exact (D a
            // power of two): the same correctly rounded quotient.
            std_.resize(size_t(lag_));
            y_.resize(size_t(kGroup * D_));
            const double fD = double(D_), invD = 1.0 / fD, fdof = double(std::max<int64_t>(D_ - 1, 1));
            const bool pow2 = (D_ & (D_ - 1)) == 0;
            double top = -INFINITY;
            for (int64_t t0 = 0; t0 < lag_; t0 += kGroup) {
                const int64_t nt = std::min<int64_t>(kGroup, lag_ - t0);
                for (int64_t l = 0; l < nt; ++l) {
                    const float* x = row(at + t0 + l);
                    double* y = y_.data() + l * D_;
                    for (int64_t d = 0; d < D_; ++d) y[d] = (double(x[d]) - lo_[size_t(d)]) / range_[size_t(d)];
                }
                double mean[kGroup] = {}, var[kGroup] = {};
                if (nt == kGroup) {
                    for (int64_t d = 0; d < D_; ++d)
                        for (int64_t l = 0; l < kGroup; ++l) mean[l] += pow2 ? y_[size_t(l * D_ + d)] * invD : y_[size_t(l * D_ + d)] / fD;
                    for (int64_t d = 0; d < D_; ++d)
                        for (int64_t l = 0; l < kGroup; ++l) {
                            const double c = y_[size_t(l * D_ + d)] - mean[l];
                            var[l] += c * c;
                        }
                } else {
                    for (int64_t l = 0; l < nt; ++l) {
                        const double* y = y_.data() + l * D_;
                        for (int64_t d = 0; d < D_; ++d) mean[l] += pow2 ? y[d] * invD : y[d] / fD;
                        for (int64_t d = 0; d < D_; ++d) var[l] += (y[d] - mean[l]) * (y[d] - mean[l]);
                    }
                }
                for (int64_t l = 0; l < nt; ++l) top = std::max(top, std_[size_t(t0 + l)] = std::sqrt(var[l] / fdof));
            }
            double z = 0;
            for (double& s : std_) z += (s = std::exp(s - top));
            for (int64_t t = 0; t < lag_; ++t) mix_[size_t(t)] += std_[size_t(t)] / z / 2;
        }
        if (cross_) {
            for (int64_t t = 0; t < lag_; ++t) out[order_[size_t(at + t)]] = float(mix_[size_t(t)]);
            return;
        }
        rank_.resize(size_t(lag_));
        std::iota(rank_.begin(), rank_.end(), 0);
        std::stable_sort(rank_.begin(), rank_.end(), [this](int32_t a, int32_t b) { return mix_[size_t(a)] < mix_[size_t(b)]; });
        // a saturated softmax gives exact ties ((1 + 0) / 2 = (0 + 1) / 2): the earlier token ranks lower
        for (int64_t k = 0; k < lag_; ++k) out[order_[size_t(at + rank_[size_t(k)])]] = float(double(k) / double(lag_));
    }
    int64_t sinks_, lag_;
    bool cross_;
    int64_t D_ = 0;
    std::vector<float> score_;          // (B*G, L)
    std::vector<float> kv_;             // (B*G, L, 2, D) key then value of each slot
    std::vector<int32_t> order_, rank_, by_pos_;  // scratch: a row's slots in position order; a block's ranking; slots by position
    std::vector<double> lo_, hi_, range_, y_, std_, mix_;  // scratch: the reference's range, a token's normalised channels, a block's stds and scores
};
}  // namespace

std::vector<PolicyInfo> lagkv_policies() {
    return {{.name = "lagkv",
             .summary = "LagKV: each block of keys and values scored against the min/max of the block after it (no queries needed)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<LagKVPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "lagkv_sinks", .help = "lagkv: first cached tokens always kept (score 1)", .def = 4, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "lagkv_lag", .help = "lagkv: tokens per block, each scored against the next", .def = 128, .lo = 1, .hi = 1 << 20, .integer = true},
                         {.name = "lagkv_cross", .help = "lagkv: 1 scores comparable across blocks (kvpress' cross_scoring), 0 ranks within each block", .def = 0, .lo = 0, .hi = 1, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#lagkv"}};
}

}  // namespace kv
