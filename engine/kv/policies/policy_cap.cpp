// cap (CAPKV, arXiv 2604.25975, "query-aware capacity"; as kvpress' CapPress): a slot is worth
// what it adds to the capacity log det(A) of the values the head keeps, weighted by how well its
// key aligns with the queries seen so far. Per (b, KV head) row and each query head h of it,
// over the cached slots j at positions >= cap_n_sink:
//   mu_h   = mean of the pre-RoPE queries the layer has seen at positions >= cap_n_sink
//   mu'_h  = Rbar mu_h, Rbar the RoPE rotation averaged over the next cap_n_future_positions
//   w_j    = exp(tau c_j - max_i tau c_i),  c_j = clamp(cos(k_j, mu'_h), -1, 1)
//   A      = I + sum_j (w_j + eps) v_j v_j^T            (D x D, f64 products, Cholesky)
//   s_j    = w_j v_j^T A^-1 v_j                           (the weighted leverage; d log det)
// score_j = mean over the group's query heads of s_j; slots at positions < cap_n_sink take the
// layer's largest score + 1 (kept). Recomputed after every chunk; keys and values are kept per
// slot (+8 D bytes per slot and row; widened to f64 in the products); no attention weights are
// needed.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_cap_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class CapPolicy final : public ScorePolicy {
   public:
    CapPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          tau_(cfg.policy_option("cap_tau")),
          n_future_(int64_t(cfg.policy_option("cap_n_future_positions"))),
          n_sink_(int64_t(cfg.policy_option("cap_n_sink"))),
          eps_(cfg.policy_option("cap_epsilon")) {}
    const char* name() const override { return "cap"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::ValueVectors, Feature::QueryVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        kv_.clear(), sum_.clear(), count_.clear();
        D_ = NH_ = 0;
        rope_ = nullptr;
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        ScorePolicy::prefill(n, f);
        observe_chunk(f, 0, n);
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        ScorePolicy::apply(plan, f);
        observe_chunk(f, plan.input_pos, plan.n);
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
        if (f.values.size() >= size_t((i + 1) * D_)) std::copy_n(f.values.data() + i * D_, D_, dst + D_);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(kv_.begin() + (r * L_ + from) * 2 * D_, 2 * D_, kv_.begin() + (r * L_ + to) * 2 * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        // Every score is recomputed here and read only from a full cache (choose_next,
        // slot_scores), so a cache still filling is not scored.
        if (D_ == 0 || T_ < L_) return;
        const int64_t D = D_, T = T_, R = NH_ > 0 ? NH_ / G_ : 1;
        const int64_t half = rope_ ? int64_t(rope_->size()) : 0;
        // Rbar: on each rotated pair (i, i + half) [[cbar, -sbar], [sbar, cbar]], the mean of
        // R(p) over p in [P, P + n_future) (closed form of the geometric sum, as expected-attention)
        std::vector<double> cb((size_t)half), sb((size_t)half);
        const double N = double(n_future_), center = double(P_) + (N - 1.0) / 2.0;
        for (int64_t i = 0; i < half; ++i) {
            const double th = (*rope_)[size_t(i)], sh = std::sin(th / 2.0);
            const double ratio = sh == 0.0 ? N : std::sin(N * th / 2.0) / sh;
            cb[size_t(i)] = std::cos(center * th) * ratio / N;
            sb[size_t(i)] = std::sin(center * th) * ratio / N;
        }
        // Per (b, g) row, over all T slots (the slots kept as rows, key then value): a sink
        // slot gets weight 0 in the capacity matrix (its terms add exact zeros) and its own
        // quantities are computed but never read. The capacity matrix, its factor and the
        // leverages per query head in policy_cap_math's tiles (docs/POLICIES.md#cap).
        std::vector<double> w((size_t)T), acc((size_t)T), l((size_t)T), kn((size_t)T), cw((size_t)T);
        std::vector<double> &MU = s_mu_, &dots = s_dots_, &v64 = s_v64_;
        v64.resize(size_t(T * D));
        MU.assign(size_t(R * D), 0.0), dots.resize(size_t(R * T));
        s_lev_.resize(size_t(cap_leverage_scratch_size(D)));
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t b = r / G_, g = r % G_;
            const int32_t* pos = pos_.data() + r * L_;
            const float* KV = kv_.data() + r * L_ * 2 * D;
            std::fill(acc.begin(), acc.end(), 0.0);
            int64_t m = 0;
            for (int64_t j = 0; j < T; ++j) m += pos[j] >= n_sink_;
            // the row's values widened to f64 once, the operand of every query head's products
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D; ++d) v64[size_t(j * D + d)] = double(KV[j * 2 * D + D + d]);
            // mu'_h of every query head of the group (0 before any query: every c_j is 0 and w_j
            // 1, the plain leverage), then k_j . mu'_h for all of them and |k_j|^2 in one pass
            for (int64_t hr = 0; hr < R; ++hr) {
                double* mu = MU.data() + hr * D;
                std::fill(mu, mu + D, 0.0);
                if (NH_ > 0) {
                    const size_t bh = size_t(b * NH_ + g * R + hr);
                    const double c = count_[bh];
                    std::vector<double>& m0 = s_m0_;
                    m0.assign((size_t)D, 0.0);
                    for (int64_t d = 0; d < D; ++d) m0[size_t(d)] = c > 0 ? sum_[bh * size_t(D) + size_t(d)] / c : 0.0;
                    std::copy(m0.begin(), m0.end(), mu);
                    for (int64_t i = 0; i < half; ++i) {
                        mu[i] = cb[size_t(i)] * m0[size_t(i)] - sb[size_t(i)] * m0[size_t(i + half)];
                        mu[i + half] = sb[size_t(i)] * m0[size_t(i)] + cb[size_t(i)] * m0[size_t(i + half)];
                    }
                }
            }
            if (m > 0) cap_key_dots(R, T, D, KV, 2 * D, MU.data(), dots.data(), kn.data());
            for (int64_t hr = 0; hr < R; ++hr) {
                const double* mu = MU.data() + hr * D;
                double mn = 0;
                for (int64_t d = 0; d < D; ++d) mn += mu[d] * mu[d];
                mn = std::max(std::sqrt(mn), 1e-12);  // F.normalize's eps
                double lmax = -INFINITY;
                for (int64_t j = 0; j < T; ++j) {
                    if (pos[j] < n_sink_) continue;
                    const double cj = std::clamp(dots[size_t(hr * T + j)] / (mn * std::max(std::sqrt(kn[size_t(j)]), 1e-12)), -1.0, 1.0);
                    lmax = std::max(lmax, w[size_t(j)] = tau_ * cj);
                }
                // w_j, then A = I + sum (w_j + eps) v_j v_j^T and v_j^T A^-1 v_j of every slot
                // (policy_cap_math.h)
                for (int64_t j = 0; j < T; ++j) {
                    if (pos[j] < n_sink_) {
                        cw[size_t(j)] = 0.0;
                        continue;
                    }
                    w[size_t(j)] = std::exp(w[size_t(j)] - lmax);
                    cw[size_t(j)] = w[size_t(j)] + eps_;
                }
                if (m == 0) continue;
                cap_leverages(T, D, v64.data(), D, cw.data(), l.data(), s_lev_.data());
                for (int64_t j = 0; j < T; ++j)
                    if (pos[j] >= n_sink_) acc[size_t(j)] += w[size_t(j)] * l[size_t(j)] / double(R);
            }
            for (int64_t j = 0; j < T; ++j) {
                if (pos[j] < n_sink_) continue;
                top = std::max(top, score_[size_t(r * L_ + j)] = float(acc[size_t(j)]));
            }
        }
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j)
                if (pos_[size_t(r * L_ + j)] < n_sink_) score_[size_t(r * L_ + j)] = std::isfinite(top) ? top + 1 : 1.0f;
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }
    // The chunk's queries at positions >= cap_n_sink, rotated back to before RoPE, into the
    // running sums of every (b, query head).
    void observe_chunk(const InsertFeatures& f, int64_t P0, int64_t n) override {
        if (f.queries.empty()) return;
        if (NH_ == 0) {
            NH_ = f.query_heads;
            if (NH_ % G_ != 0) throw Error(str("cap: ", NH_, " query heads are not a multiple of ", G_, " KV heads"));
            sum_.assign(size_t(B_ * NH_ * D_), 0.0);
            count_.assign(size_t(B_ * NH_), 0.0);
        }
        rope_ = f.rope_inv_freq;
        const int64_t D = D_, half = rope_ ? int64_t(rope_->size()) : 0;
        std::vector<double> cs((size_t)half), sn((size_t)half);
        for (int64_t t = 0; t < n; ++t) {
            const int64_t p = P0 + t;
            if (p < n_sink_) continue;
            for (int64_t i = 0; i < half; ++i) {  // R(p), once per position for every (b, query head)
                const double a = double(p) * (*rope_)[size_t(i)];
                cs[size_t(i)] = std::cos(a), sn[size_t(i)] = std::sin(a);
            }
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t h = 0; h < NH_; ++h) {
                    const size_t bh = size_t(b * NH_ + h);
                    const float* q = f.queries.data() + ((b * NH_ + h) * n + t) * D;
                    double* s1 = sum_.data() + bh * size_t(D);
                    for (int64_t d = 0; d < D; ++d) s1[d] += double(q[d]);
                    for (int64_t i = 0; i < half; ++i) {  // R(p)^T on the rotated pairs, in place of the sums just added
                        const double c = cs[size_t(i)], s = sn[size_t(i)];
                        s1[i] += double(q[i]) * c + double(q[i + half]) * s - double(q[i]);
                        s1[i + half] += double(q[i + half]) * c - double(q[i]) * s - double(q[i + half]);
                    }
                    count_[bh] += 1;
                }
        }
    }

   private:
    double tau_;
    int64_t n_future_, n_sink_;
    double eps_;
    int64_t D_ = 0, NH_ = 0;
    const std::vector<double>* rope_ = nullptr;
    std::vector<float> score_;           // (B*G, L)
    std::vector<float> kv_;              // (B*G, L, 2, D) key (as cached, rotated) then value of each slot
    std::vector<double> sum_, count_;    // per (b, query head): sum of pre-RoPE queries, their count
    std::vector<double> s_mu_, s_dots_, s_m0_, s_lev_, s_v64_;  // scratch of accumulate(), reused across calls
};
}  // namespace

std::vector<PolicyInfo> cap_policies() {
    return {{.name = "cap",
             .summary = "CAPKV: the query-weighted leverage of each value in the log-determinant capacity of the head's values",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CapPolicy>(a.cfg, a.L, a.G); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "cap_tau", .help = "cap: temperature of the query-key alignment weights exp(tau cos)", .def = 5, .lo = 0, .hi = 1e4},
                         {.name = "cap_n_future_positions", .help = "cap: future positions RoPE is averaged over for the query anchor", .def = 512, .lo = 1, .hi = 1 << 20, .integer = true},
                         {.name = "cap_n_sink", .help = "cap: first tokens always kept and left out of the query anchor", .def = 4, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "cap_epsilon", .help = "cap: added to each weight in the capacity matrix", .def = 1e-6, .lo = 0, .hi = 1}},
             .doc_anchor = "docs/POLICIES.md#cap"}};
}

}  // namespace kv
