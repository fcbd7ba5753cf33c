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
// slot (+8 D bytes per slot and row); no attention weights are needed.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"
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
        if (D_ == 0) return;
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
        std::vector<double> mu((size_t)D), w((size_t)T), A((size_t)(D * D)), acc((size_t)T);
        std::vector<double> &X = s_x_, &Xt = s_xt_, &V = s_v_, &Y = s_y_, &Mt = s_mt_;
        Mt.resize(size_t(D * D));
        std::vector<int64_t> js;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t b = r / G_, g = r % G_;
            const int32_t* pos = pos_.data() + r * L_;
            const float* KV = kv_.data() + r * L_ * 2 * D;
            std::fill(acc.begin(), acc.end(), 0.0);
            js.clear();
            for (int64_t j = 0; j < T; ++j)
                if (pos[j] >= n_sink_) js.push_back(j);
            for (int64_t hr = 0; hr < R; ++hr) {
                // mu'_h (0 before any query: every c_j is 0 and w_j 1, the plain leverage)
                std::fill(mu.begin(), mu.end(), 0.0);
                if (NH_ > 0) {
                    const size_t bh = size_t(b * NH_ + g * R + hr);
                    const double c = count_[bh];
                    std::vector<double> m0((size_t)D, 0.0);
                    for (int64_t d = 0; d < D; ++d) m0[size_t(d)] = c > 0 ? sum_[bh * size_t(D) + size_t(d)] / c : 0.0;
                    mu = m0;
                    for (int64_t i = 0; i < half; ++i) {
                        mu[size_t(i)] = cb[size_t(i)] * m0[size_t(i)] - sb[size_t(i)] * m0[size_t(i + half)];
                        mu[size_t(i + half)] = sb[size_t(i)] * m0[size_t(i)] + cb[size_t(i)] * m0[size_t(i + half)];
                    }
                }
                double mn = 0;
                for (double v : mu) mn += v * v;
                mn = std::max(std::sqrt(mn), 1e-12);  // F.normalize's eps
                double lmax = -INFINITY;
                for (int64_t j = 0; j < T; ++j) {
                    if (pos[j] < n_sink_) continue;
                    const float* k = KV + j * 2 * D;
                    double dot = 0, kn = 0;
                    for (int64_t d = 0; d < D; ++d) dot += double(k[d]) * mu[size_t(d)], kn += double(k[d]) * double(k[d]);
                    const double cj = std::clamp(dot / (mn * std::max(std::sqrt(kn), 1e-12)), -1.0, 1.0);
                    lmax = std::max(lmax, w[size_t(j)] = tau_ * cj);
                }
                // A = I + X X^T, X (D x m) the non-sink values scaled by sqrt(w + eps); then
                // v^T A^-1 v = |M v|^2 with M = L^-1 (A = L L^T): both as f64 products
                const int64_t m = int64_t(js.size());
                X.resize(size_t(D * m)), Xt.resize(size_t(m * D)), V.resize(size_t(m * D)), Y.resize(size_t(m * D));
                for (int64_t i = 0; i < m; ++i) {
                    const int64_t j = js[size_t(i)];
                    w[size_t(j)] = std::exp(w[size_t(j)] - lmax);
                    const float* v = KV + j * 2 * D + D;
                    const double a = std::sqrt(w[size_t(j)] + eps_);
                    for (int64_t d = 0; d < D; ++d) {
                        V[size_t(i * D + d)] = double(v[d]);
                        Xt[size_t(i * D + d)] = X[size_t(d * m + i)] = a * double(v[d]);
                    }
                }
                std::fill(A.begin(), A.end(), 0.0);
                for (int64_t d = 0; d < D; ++d) A[size_t(d * D + d)] = 1.0;
                if (m > 0) policy_matmul(D, D, m, X.data(), m, Xt.data(), D, A.data(), D, true);
                cholesky(A, D);  // lower triangle of A = L L^T
                // Mt = (L^-1)^T: column c of L^-1 by forward substitution on e_c
                std::fill(Mt.begin(), Mt.end(), 0.0);
                for (int64_t c = 0; c < D; ++c)
                    for (int64_t d = c; d < D; ++d) {
                        double t = d == c ? 1.0 : 0.0;
                        for (int64_t e = c; e < d; ++e) t -= A[size_t(d * D + e)] * Mt[size_t(c * D + e)];
                        Mt[size_t(c * D + d)] = t / A[size_t(d * D + d)];  // (L^-1)[d][c]
                    }
                if (m > 0) policy_matmul(m, D, D, V.data(), D, Mt.data(), D, Y.data(), D);  // rows (L^-1 v_j)^T
                for (int64_t i = 0; i < m; ++i) {
                    double l = 0;
                    for (int64_t d = 0; d < D; ++d) l += Y[size_t(i * D + d)] * Y[size_t(i * D + d)];
                    const int64_t j = js[size_t(i)];
                    acc[size_t(j)] += w[size_t(j)] * l / double(R);
                }
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
        for (int64_t t = 0; t < n; ++t) {
            const int64_t p = P0 + t;
            if (p < n_sink_) continue;
            for (int64_t b = 0; b < B_; ++b)
                for (int64_t h = 0; h < NH_; ++h) {
                    const size_t bh = size_t(b * NH_ + h);
                    const float* q = f.queries.data() + ((b * NH_ + h) * n + t) * D;
                    double* s1 = sum_.data() + bh * size_t(D);
                    for (int64_t d = 0; d < D; ++d) s1[d] += double(q[d]);
                    for (int64_t i = 0; i < half; ++i) {  // R(p)^T on the rotated pairs, in place of the sums just added
                        const double a = double(p) * (*rope_)[size_t(i)], c = std::cos(a), s = std::sin(a);
                        s1[i] += double(q[i]) * c + double(q[i + half]) * s - double(q[i]);
                        s1[i + half] += double(q[i + half]) * c - double(q[i]) * s - double(q[i + half]);
                    }
                    count_[bh] += 1;
                }
        }
    }

   private:
    // In-place Cholesky of the symmetric positive definite A (lower triangle read and written).
    static void cholesky(std::vector<double>& A, int64_t D) {
        for (int64_t j = 0; j < D; ++j) {
            double d = A[size_t(j * D + j)];
            for (int64_t k = 0; k < j; ++k) d -= A[size_t(j * D + k)] * A[size_t(j * D + k)];
            A[size_t(j * D + j)] = std::sqrt(std::max(d, 1e-300));
            for (int64_t i = j + 1; i < D; ++i) {
                double s = A[size_t(i * D + j)];
                for (int64_t k = 0; k < j; ++k) s -= A[size_t(i * D + k)] * A[size_t(j * D + k)];
                A[size_t(i * D + j)] = s / A[size_t(j * D + j)];
            }
        }
    }

    double tau_;
    int64_t n_future_, n_sink_;
    double eps_;
    int64_t D_ = 0, NH_ = 0;
    const std::vector<double>* rope_ = nullptr;
    std::vector<float> score_;           // (B*G, L)
    std::vector<float> kv_;              // (B*G, L, 2, D) key (as cached, rotated) then value of each slot
    std::vector<double> sum_, count_;    // per (b, query head): sum of pre-RoPE queries, their count
    std::vector<double> s_x_, s_xt_, s_v_, s_y_, s_mt_;  // scratch of accumulate(), reused across calls
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
