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
#include "engine/kv/policies/policy_expected_attention_math.h"
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
        // Per (b, g) row: the non-sink keys and values in f64, transposed (D x mp, columns padded
        // with zeros to a multiple of 16 so the products stay on their vector tiles), shared by
        // the group's query heads. Every sum below is the one the plain per-slot loops took, term
        // for term in the same order (padding and the zeros of a triangle add exact +0), so the
        // scores are bit for bit those of the slot-at-a-time form (docs/POLICIES.md#cap).
        const int64_t Rp = (R + 3) / 4 * 4;
        std::vector<double> w((size_t)T), A((size_t)(D * D)), acc((size_t)T), l, kn, col((size_t)D);
        std::vector<double> &V = s_v_, &Vt = s_vt_, &Kt = s_kt_, &Xt = s_xt_, &Yt = s_y_, &Li = s_li_, &MU = s_mu_, &dots = s_dots_;
        Li.resize(size_t(D * D)), MU.assign(size_t(Rp * D), 0.0);
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
            const int64_t m = int64_t(js.size()), mp = (m + 15) / 16 * 16;
            V.resize(size_t(m * D)), Xt.resize(size_t(m * D));
            Vt.assign(size_t(D * mp), 0.0), Kt.assign(size_t(D * mp), 0.0), Yt.resize(size_t(D * mp)), dots.resize(size_t(Rp * mp));
            // transposed in blocks of 16 slots: each of Kt's and Vt's rows gets 16 values at a time
            for (int64_t i0 = 0; i0 < m; i0 += 16) {
                const int64_t i1 = std::min<int64_t>(m, i0 + 16);
                for (int64_t i = i0; i < i1; ++i) {
                    const float* v = KV + js[size_t(i)] * 2 * D + D;
                    for (int64_t d = 0; d < D; ++d) V[size_t(i * D + d)] = double(v[d]);
                }
                for (int64_t d = 0; d < D; ++d)
                    for (int64_t i = i0; i < i1; ++i) {
                        Kt[size_t(d * mp + i)] = double(KV[js[size_t(i)] * 2 * D + d]);
                        Vt[size_t(d * mp + i)] = V[size_t(i * D + d)];
                    }
            }
            // |k_j| (sum over d in order), once per row instead of once per query head
            kn.assign(size_t(mp), 0.0);
            for (int64_t d = 0; d < D; ++d) {
                const double* kd = Kt.data() + d * mp;
                for (int64_t i = 0; i < mp; ++i) kn[size_t(i)] += kd[i] * kd[i];
            }
            // mu'_h of every query head of the group (0 before any query: every c_j is 0 and w_j
            // 1, the plain leverage), then k_j . mu'_h for all of them in one product
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
            if (m > 0) policy_matmul(Rp, mp, D, MU.data(), D, Kt.data(), mp, dots.data(), mp);
            for (int64_t hr = 0; hr < R; ++hr) {
                const double* mu = MU.data() + hr * D;
                double mn = 0;
                for (int64_t d = 0; d < D; ++d) mn += mu[d] * mu[d];
                mn = std::max(std::sqrt(mn), 1e-12);  // F.normalize's eps
                double lmax = -INFINITY;
                for (int64_t i = 0; i < m; ++i) {
                    const double cj = std::clamp(dots[size_t(hr * mp + i)] / (mn * std::max(std::sqrt(kn[size_t(i)]), 1e-12)), -1.0, 1.0);
                    lmax = std::max(lmax, w[size_t(js[size_t(i)])] = tau_ * cj);
                }
                // A = I + X X^T, X^T (m x D) the non-sink values scaled by sqrt(w + eps): its
                // upper triangle (ea_moments_upper: the sums of the full product); then
                // v^T A^-1 v = |L^-1 v|^2 (A = L L^T) for every v at once, Y^T = L^-1 V^T
                for (int64_t i = 0; i < m; ++i) {
                    const int64_t j = js[size_t(i)];
                    w[size_t(j)] = std::exp(w[size_t(j)] - lmax);
                    const double a = std::sqrt(w[size_t(j)] + eps_);
                    for (int64_t d = 0; d < D; ++d) Xt[size_t(i * D + d)] = a * V[size_t(i * D + d)];
                }
                std::fill(A.begin(), A.end(), 0.0);
                for (int64_t d = 0; d < D; ++d) A[size_t(d * D + d)] = 1.0;
                if (m > 0) ea_moments_upper(m, D, Xt.data(), A.data());
                cholesky_upper(A.data(), D, col.data());  // A's upper triangle becomes L^T
                inverse_lower(A.data(), D, Li.data(), col.data());
                // L^-1 is lower triangular: row block [d0, d0 + 16) of Y^T needs columns < d0 + 16
                for (int64_t d0 = 0; d0 < D && m > 0; d0 += 16) {
                    const int64_t rb = std::min<int64_t>(16, D - d0);
                    policy_matmul(rb, mp, d0 + rb, Li.data() + d0 * D, D, Vt.data(), mp, Yt.data() + d0 * mp, mp);
                }
                l.assign(size_t(mp), 0.0);
                for (int64_t d = 0; d < D; ++d) {
                    const double* yd = Yt.data() + d * mp;
                    for (int64_t i = 0; i < mp; ++i) l[size_t(i)] += yd[i] * yd[i];
                }
                for (int64_t i = 0; i < m; ++i) {
                    const int64_t j = js[size_t(i)];
                    acc[size_t(j)] += w[size_t(j)] * l[size_t(i)] / double(R);
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
    // In-place Cholesky A = L L^T of the symmetric positive definite A given by its upper
    // triangle U (row-major, U[j][i] = A[i][j], i >= j), which becomes L^T (U[k][i] = L[i][k]).
    // Column j of L is computed for every i >= j at once (s: scratch of D), each entry with the
    // subtractions of the textbook loop in the same order (k ascending), so the same bits.
    static void cholesky_upper(double* U, int64_t D, double* s) {
        for (int64_t j = 0; j < D; ++j) {
            double* uj = U + j * D;
            std::copy(uj + j, uj + D, s + j);
            for (int64_t k = 0; k < j; ++k) {
                const double* uk = U + k * D;  // L[i][k] for i >= k
                const double t = uk[j];
                for (int64_t i = j; i < D; ++i) s[i] -= uk[i] * t;
            }
            const double piv = std::sqrt(std::max(s[j], 1e-300));
            uj[j] = piv;
            for (int64_t i = j + 1; i < D; ++i) uj[i] = s[i] / piv;
        }
    }
    // Li = L^-1 (row-major, lower triangular, zeros above) from Lt = L^T (cholesky_upper):
    // forward substitution on the unit vectors, row d for every column c <= d at once, each
    // entry (L^-1)[d][c] = (delta - sum_{e=c}^{d-1} L[d][e] (L^-1)[e][c]) / L[d][d] with e ascending.
    static void inverse_lower(const double* Lt, int64_t D, double* Li, double* t) {
        for (int64_t d = 0; d < D; ++d) {
            std::fill(t, t + d + 1, 0.0);
            t[d] = 1.0;
            for (int64_t e = 0; e < d; ++e) {
                const double coef = Lt[e * D + d];  // L[d][e]
                const double* le = Li + e * D;
                for (int64_t c = 0; c <= e; ++c) t[c] -= coef * le[c];
            }
            const double piv = Lt[d * D + d];
            double* ld = Li + d * D;
            for (int64_t c = 0; c <= d; ++c) ld[c] = t[c] / piv;
            std::fill(ld + d + 1, ld + D, 0.0);
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
    std::vector<double> s_v_, s_vt_, s_kt_, s_xt_, s_y_, s_li_, s_mu_, s_dots_, s_m0_;  // scratch of accumulate(), reused across calls
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
