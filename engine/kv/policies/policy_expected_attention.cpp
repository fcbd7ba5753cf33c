// expected-attention (Devoto et al. 2025, "Expected Attention: KV Cache Compression by
// Estimating Attention from Future Queries Distribution"; kvpress' ExpectedAttentionPress): a
// key is worth its slot by the attention that *future* queries are expected to give it. Queries
// before RoPE are modelled as a Gaussian N(mu, Sigma) per (batch row, query head), estimated
// from every query the layer has seen at positions >= n_sink; RoPE over the next
// n_future_positions positions is averaged into one matrix Rbar (2x2 blocks of mean cos / sin),
// so a future query is q ~ N(Rbar mu, Rbar Sigma Rbar^T). For a key k (as cached, rotated), with
// the layer's attention scale s,
//   E[exp(s q.k)] = exp(s k.mu' + s^2 k^T Sigma' k / 2)          (the Gaussian's MGF)
//   a_j = softmax over the non-sink slots of that exponent, averaged over the group's heads,
//   score_j = a_j * |v_j|,  and the first n_sink tokens take the row's maximum (kept).
// Scores are recomputed after every chunk from the statistics so far; no attention weights
// are needed. Keys are kept per slot beside the buffer (+4 D bytes per slot and row, as rkv).
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/backend/host_parallel.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_expected_attention_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class ExpectedAttentionPolicy final : public ScorePolicy {
   public:
    ExpectedAttentionPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          n_future_(int64_t(cfg.policy_option("ea_n_future_positions"))),
          n_sink_(int64_t(cfg.policy_option("ea_n_sink"))),
          use_cov_(cfg.policy_option("ea_use_covariance") != 0),
          use_vnorm_(cfg.policy_option("ea_use_vnorm") != 0) {}
    const char* name() const override { return "expected-attention"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::ValueNorm, Feature::QueryVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        vnorm_.assign(size_t(rows() * L_), 0.0f);
        keys_.clear();
        sum_.clear(), sum2_.clear(), count_.clear();
        D_ = NH_ = 0;
        rope_ = nullptr;
        scale_ = 0;
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
            keys_.assign(size_t(rows() * L_ * D_), 0.0f);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        vnorm_[size_t(r * L_ + slot)] = f.value_norm[size_t(i)];
        std::copy_n(f.keys.begin() + i * D_, D_, keys_.begin() + (r * L_ + slot) * D_);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        vnorm_[size_t(r * L_ + to)] = vnorm_[size_t(r * L_ + from)];
        std::copy_n(keys_.begin() + (r * L_ + from) * D_, D_, keys_.begin() + (r * L_ + to) * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        if (NH_ == 0 || D_ == 0) return;  // no queries seen (a cache driven without them)
        const int64_t D = D_, R = NH_ / G_, T = T_;
        // Rbar has one 2x2 block per rotated pair (i, i + half): row d's nonzeros sit in
        // columns d and partner(d), with coefficients diag[d] and off[d].
        std::vector<double>&rc = s_rc_, &rs = s_rs_;
        mean_future_rotation(rc, rs);
        const int64_t half = int64_t(rc.size());
        std::vector<double>&diag = s_diag_, &off = s_off_;
        diag.assign((size_t)D, 1.0), off.assign((size_t)D, 0.0);
        std::vector<int64_t>& partner = s_partner_;
        partner.resize((size_t)D);
        for (int64_t d = 0; d < D; ++d) {
            partner[size_t(d)] = d < half ? d + half : d < 2 * half ? d - half : d;
            if (d < 2 * half) {
                const int64_t i = d < half ? d : d - half;
                diag[size_t(d)] = rc[size_t(i)];
                off[size_t(d)] = d < half ? -rs[size_t(i)] : rs[size_t(i)];
            }
        }
        // The (b, g) rows are independent (each writes its own scores and its own maximum): one
        // per thread, each with its own scratch, the same bits at any count.
        std::vector<float> row_top(size_t(B_ * G_), -std::numeric_limits<float>::infinity());
        host_parallel_units(B_ * G_, [&](int64_t r) {
            float& top = row_top[size_t(r)];
            const int64_t b = r / G_, g = r % G_;
            RowScratch& sc = row_scratch();
            std::vector<double>&mu = sc.mu, &cov = sc.cov, &rcov = sc.rcov, &mup = sc.mup;
            mu.resize((size_t)D), cov.resize((size_t)(D * D)), rcov.resize((size_t)(D * D)), mup.resize((size_t)(R * D));
            // U: the upper triangles of the group's R Sigma'_h side by side (D x R D, f32,
            // diagonal halved, zeros below): k^T Sigma'_h k = 2 k^T U_h k, half the products
            // of K . Sigma' (policy_expected_attention_math.h). The zeros are written once
            // per shape (the scratch is the thread's, shared by every layer and model).
            std::vector<float>& U = sc.u;
            if (sc.u_D != D || sc.u_R != R) U.assign(size_t(D * R * D), 0.0f), sc.u_D = D, sc.u_R = R;
            std::vector<double>&lin = sc.lin, &quad = sc.quad, &ex = sc.ex, &acc = sc.acc;
            lin.resize((size_t)(R * T)), quad.resize((size_t)(R * T)), ex.resize((size_t)T), acc.resize((size_t)T);
            const int32_t* pos = pos_.data() + r * L_;
            const float* K = keys_.data() + r * L_ * D;
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t hr = 0; hr < R; ++hr) {
                const size_t bh = size_t(b * NH_ + g * R + hr);
                const double c = count_[bh];
                for (int64_t d = 0; d < D; ++d) mu[size_t(d)] = c > 0 ? sum_[bh * size_t(D) + size_t(d)] / c : 0.0;
                // mu' = Rbar mu
                for (int64_t d = 0; d < D; ++d)
                    mup[size_t(hr * D + d)] = diag[size_t(d)] * mu[size_t(d)] + off[size_t(d)] * mu[size_t(partner[size_t(d)])];
                if (!use_cov_) continue;
                // sum2 holds the upper triangle (observe_chunk); Sigma is symmetric, so the
                // lower half is its mirror (bit for bit what the full sums gave)
                const double* s2 = sum2_.data() + bh * size_t(D * D);
                if (c > 0) {
                    for (int64_t d = 0; d < D; ++d) {  // rows of the upper triangle (contiguous), then the mirror
                        const double md = mu[size_t(d)];
                        const double* s2r = s2 + d * D;
                        double* cr = cov.data() + d * D;
                        for (int64_t e = d; e < D; ++e) cr[e] = s2r[e] / c - md * mu[size_t(e)];
                    }
                    for (int64_t d = 0; d < D; ++d)
                        for (int64_t e = d + 1; e < D; ++e) cov[size_t(e * D + d)] = cov[size_t(d * D + e)];
                } else {
                    std::fill(cov.begin(), cov.end(), 0.0);
                }
                // Sigma' = Rbar Sigma Rbar^T: rows first (Rbar Sigma), then columns
                for (int64_t d = 0; d < D; ++d) {
                    const double* c0 = cov.data() + d * D;
                    const double* c1 = cov.data() + partner[size_t(d)] * D;
                    const double a0 = diag[size_t(d)], a1 = off[size_t(d)];
                    for (int64_t e = 0; e < D; ++e) rcov[size_t(d * D + e)] = a0 * c0[e] + a1 * c1[e];
                }
                // columns: e's partner is e + half, e - half or e itself by range, so each
                // range is one contiguous loop
                for (int64_t d = 0; d < D; ++d) {
                    float* u = U.data() + d * R * D + hr * D;
                    const double* rc0 = rcov.data() + d * D;
                    const double *dg = diag.data(), *of = off.data();
                    for (int64_t e = d; e < half; ++e) u[e] = float(rc0[e] * dg[e] + rc0[e + half] * of[e]);
                    for (int64_t e = std::max(d, half); e < 2 * half; ++e) u[e] = float(rc0[e] * dg[e] + rc0[e - half] * of[e]);
                    for (int64_t e = std::max(d, 2 * half); e < D; ++e) u[e] = float(rc0[e] * dg[e] + rc0[e] * of[e]);
                    u[d] /= 2.0f;
                }
            }
            // The slots this row holds: all of them in a plain cache; in a per-head pool
            // (ada-*, lukv-*) the row's own slots only, gathered, so the other heads' slots
            // cost no forms (each slot's forms are its own sums: the same bits either way).
            std::vector<int32_t>& idx = sc.idx;
            idx.clear();
            for (int64_t j = 0; j < T; ++j)
                if (pos[j] >= 0) idx.push_back(int32_t(j));
            const int64_t Tc = int64_t(idx.size());
            const float* Kc = K;
            if (Tc < T) {
                std::vector<float>& kc = sc.kc;
                kc.resize(size_t(Tc * D));
                for (int64_t c = 0; c < Tc; ++c) std::copy_n(K + int64_t(idx[size_t(c)]) * D, D, kc.begin() + c * D);
                Kc = kc.data();
            }
            ea_key_forms(Tc, D, R, Kc, D, U.data(), R * D, mup.data(), lin.data(), use_cov_ ? quad.data() : nullptr);
            // / R as a product with 1 / R where that is exact (R a power of two): the same
            // correctly rounded quotient without a division per slot and head
            const double fR = double(R), invR = 1.0 / fR;
            const bool pow2R = (R & (R - 1)) == 0;
            for (int64_t hr = 0; hr < R; ++hr) {
                double m = -std::numeric_limits<double>::infinity();
                double* lg = lin.data() + hr * Tc;  // becomes the logit
                const double* qd = quad.data() + hr * Tc;
                for (int64_t c = 0; c < Tc; ++c) {
                    if (pos[idx[size_t(c)]] < n_sink_) continue;
                    lg[c] = scale_ * lg[c] + (use_cov_ ? scale_ * scale_ * qd[c] / 2.0 : 0.0);
                    m = std::max(m, lg[c]);
                }
                double z = 0;
                for (int64_t c = 0; c < Tc; ++c)
                    if (pos[idx[size_t(c)]] >= n_sink_) z += (ex[size_t(idx[size_t(c)])] = std::exp(lg[c] - m));
                for (int64_t c = 0; c < Tc; ++c) {
                    const int32_t j = idx[size_t(c)];
                    if (pos[j] >= n_sink_) acc[size_t(j)] += pow2R ? ex[size_t(j)] / z * invR : ex[size_t(j)] / z / fR;
                }
            }
            for (int64_t j = 0; j < T; ++j) {
                if (pos[j] < n_sink_) continue;
                const float s = float(acc[size_t(j)] * (use_vnorm_ ? double(vnorm_[size_t(r * L_ + j)]) : 1.0));
                score_[size_t(r * L_ + j)] = s;
                top = std::max(top, s);
            }
        });
        // over the whole layer (sinks, below)
        const float top = *std::max_element(row_top.begin(), row_top.end());
        // Sinks are kept: kvpress pads them with the maximum over the whole layer (every batch
        // row and head), not a row's own maximum — under ada-*'s top-k over all heads' slots a
        // row maximum does not keep a low-scoring head's sinks.
        for (int64_t r = 0; r < B_ * G_; ++r)
            for (int64_t j = 0; j < T; ++j)
                if (pos_[size_t(r * L_ + j)] < n_sink_) score_[size_t(r * L_ + j)] = std::isfinite(top) ? top : 0.0f;
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

    // Add the chunk's queries at positions >= n_sink, rotated back to before RoPE, to the
    // running sums of every (b, query head).
    void observe_chunk(const InsertFeatures& f, int64_t P0, int64_t n) override {
        if (f.queries.empty()) return;
        if (NH_ == 0) {
            NH_ = f.query_heads;
            if (NH_ % G_ != 0) throw Error(str("expected-attention: ", NH_, " query heads are not a multiple of ", G_, " KV heads"));
            sum_.assign(size_t(B_ * NH_ * D_), 0.0);
            sum2_.assign(size_t(B_ * NH_ * D_ * D_), 0.0);
            count_.assign(size_t(B_ * NH_), 0.0);
        }
        rope_ = f.rope_inv_freq;
        scale_ = double(f.attn_scale);
        const int64_t D = D_, half = rope_ ? int64_t(rope_->size()) : 0;
        // cos / sin of every (position, pair) once per chunk, shared by all heads and layers
        const ChunkRotation& cr = chunk_rotation(rope_, P0, n);
        const std::vector<double>&cs = cr.cs, &sn = cr.sn;
        // one head's rotated queries as rows (X, m x D): sum += x per row, sum2 += X^T X
        std::vector<double>& X = s_x_;
        X.resize((size_t)(n * D));
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t h = 0; h < NH_; ++h) {
                const size_t bh = size_t(b * NH_ + h);
                double* s1 = sum_.data() + bh * size_t(D);
                int64_t m = 0;
                for (int64_t t = 0; t < n; ++t) {
                    const int64_t p = P0 + t;
                    if (p < n_sink_) continue;
                    const float* q = f.queries.data() + ((b * NH_ + h) * n + t) * D;
                    double* x = X.data() + m * D;
                    for (int64_t d = 0; d < D; ++d) x[d] = q[d];
                    for (int64_t i = 0; i < half; ++i) {  // R(p)^T: rotate pair (i, i + half) by -p theta_i
                        const double c = cs[size_t(t * half + i)], s = sn[size_t(t * half + i)];
                        x[i] = double(q[i]) * c + double(q[i + half]) * s;
                        x[i + half] = double(q[i + half]) * c - double(q[i]) * s;
                    }
                    for (int64_t d = 0; d < D; ++d) s1[d] += x[d];
                    ++m;
                }
                if (m == 0) continue;
                count_[bh] += double(m);
                // upper triangle only (the sums are symmetric; accumulate() mirrors them), each
                // entry the same ordered sum as the full product's
                ea_moments_upper(m, D, X.data(), sum2_.data() + bh * size_t(D * D));
            }
    }
   private:
    // cos / sin of (P0 + t) theta_i for t < n, i < half. Every layer's policy asks for the same
    // chunks in turn (the eval driver runs a layer over a few chunks before the next layer), so
    // the last few are kept per thread, all values as computed the first time.
    struct ChunkRotation {
        std::vector<double> freq, cs, sn;
        int64_t P0 = -1, n = 0;
    };
    static const ChunkRotation& chunk_rotation(const std::vector<double>* rope, int64_t P0, int64_t n) {
        constexpr size_t kKept = 8;
        thread_local ChunkRotation kept[kKept];
        thread_local size_t next = 0;
        static const std::vector<double> none;
        const std::vector<double>& f = rope ? *rope : none;
        for (const ChunkRotation& c : kept)
            if (c.P0 == P0 && c.n == n && c.freq == f) return c;
        ChunkRotation& c = kept[next];
        next = (next + 1) % kKept;
        const int64_t half = int64_t(f.size());
        c.freq = f, c.P0 = P0, c.n = n;
        c.cs.resize((size_t)(n * half)), c.sn.resize((size_t)(n * half));
        for (int64_t t = 0; t < n; ++t)
            for (int64_t i = 0; i < half; ++i) {
                const double a = double(P0 + t) * f[size_t(i)];
                c.cs[size_t(t * half + i)] = std::cos(a), c.sn[size_t(t * half + i)] = std::sin(a);
            }
        return c;
    }
    // Rbar = mean over p in [P, P + n_future) of R(p): on each rotated pair (i, i + half) the
    // block [[cbar_i, -sbar_i], [sbar_i, cbar_i]]; identity on unrotated dimensions.
    void mean_future_rotation(std::vector<double>& c, std::vector<double>& s) const {
        const int64_t half = rope_ ? int64_t(rope_->size()) : 0;
        c.assign(size_t(half), 0.0), s.assign(size_t(half), 0.0);
        // Closed form of the geometric sum: sum_{p=P}^{P+N-1} e^{i p theta}
        //   = e^{i (P + (N-1)/2) theta} sin(N theta / 2) / sin(theta / 2)   (N when theta = 0),
        // two sin/cos per pair instead of N (f64; equal to the loop to rounding).
        const double N = double(n_future_), center = double(P_) + (N - 1.0) / 2.0;
        for (int64_t i = 0; i < half; ++i) {
            const double th = (*rope_)[size_t(i)], sh = std::sin(th / 2.0);
            const double ratio = sh == 0.0 ? N : std::sin(N * th / 2.0) / sh;
            c[size_t(i)] = std::cos(center * th) * ratio / N;
            s[size_t(i)] = std::sin(center * th) * ratio / N;
        }
    }

    int64_t n_future_, n_sink_;
    bool use_cov_, use_vnorm_;
    int64_t D_ = 0, NH_ = 0;
    const std::vector<double>* rope_ = nullptr;
    double scale_ = 0;
    std::vector<float> score_, vnorm_;  // (B*G, L)
    std::vector<float> keys_;           // (B*G, L, D) keys as cached (rotated)
    std::vector<double> sum_, sum2_, count_;  // per (b, query head): sum x, sum x x^T (upper triangle), count (pre-RoPE queries)
    // scratch of accumulate() and absorb(), reused across calls (sized on use)
    std::vector<double> s_rc_, s_rs_, s_diag_, s_off_, s_x_;
    std::vector<int64_t> s_partner_;
    // One row's scratch in accumulate(), per thread: KS alone is T x R D floats (245 KiB for
    // SmolLM2), and a fresh allocation of that size is an mmap with page faults on every call.
    struct RowScratch {
        std::vector<double> mu, cov, rcov, mup, lin, quad, ex, acc;
        std::vector<int32_t> idx;  // the row's held slots
        std::vector<float> kc;     // their keys gathered, when the row does not hold every slot
        std::vector<float> u;      // the group's upper triangles (zeros below), for u_D x u_R
        int64_t u_D = -1, u_R = -1;
    };
    static RowScratch& row_scratch() {
        static thread_local RowScratch s;
        return s;
    }
};
}  // namespace

std::vector<PolicyInfo> expected_attention_policies() {
    return {{.name = "expected-attention",
             .summary = "Expected Attention: attention future queries (Gaussian, RoPE-averaged) are expected to give, times |v|",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
                 return std::make_unique<ExpectedAttentionPolicy>(a.cfg, a.L, a.G);
             },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "ea_n_future_positions", .help = "expected-attention: future positions RoPE is averaged over", .def = 512, .lo = 1, .hi = 1 << 20, .integer = true},
                         {.name = "ea_n_sink", .help = "expected-attention: first tokens always kept and left out of the query statistics", .def = 4, .lo = 0, .hi = 1 << 20, .integer = true},
                         {.name = "ea_use_covariance", .help = "expected-attention: 1 = include the query covariance term, 0 = mean only", .def = 1, .lo = 0, .hi = 1, .integer = true},
                         {.name = "ea_use_vnorm", .help = "expected-attention: 1 = multiply by the value norm", .def = 1, .lo = 0, .hi = 1, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#expected-attention"}};
}

}  // namespace kv
