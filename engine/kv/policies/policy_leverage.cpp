// leverage (kvpress' LeverageScorePress, the geometric half of Compactor: Chari & Van Durme
// 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage
// Scores"): keys that are statistical outliers of their head carry information the others do
// not, so a token scores its key's approximate leverage. After every chunk, per (b, g) row
// over the T cached pre-RoPE keys:
//   X = K - mean_j k_j (T x D),  Y = X Phi (T x k, Phi a fixed Gaussian sketch, 0: Y = X)
//   l_j = max(0, y_j^T (Y^T Y + 0.01 I)^-1 y_j)      (Cholesky; kvpress' first jitter)
//   score_j = (l_j - mean l) / max(std l, 1e-6)        over every cached token of the layer
// Keys are un-rotated with the layer's RoPE frequencies when written and kept per slot as their
// projection k Phi (Y = K Phi - mean_j k_j Phi: the same Y, without a T x D x k product per
// chunk; a sketch wider than the key by its D x D factor, LeverageSketch::factored);
// a cache still filling is not scored (nothing reads it). Phi's
// entries are a documented pure function of (layer, head, index) (docs/POLICIES.md#leverage),
// where kvpress draws a fresh torch.randn per call.
#include "engine/kv/policies/policy_leverage.h"

#include <algorithm>
#include <cmath>

#include "engine/kv/policies/policy_fma_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
uint64_t mix(uint64_t z) {  // splitmix64's finalizer (as random's draws)
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
}  // namespace

void LeverageSketch::init(int64_t layer, int64_t G, int64_t D) {
    phi.clear();
    proj_by_.clear();
    if (k == 0) return;
    // Phi[g][d][c] = N(0, 1) / sqrt(k) by Box-Muller from two splitmix64 draws
    phi.assign(size_t(G * D * k), 0.0);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t e = 0; e < D * k; ++e) {
            const uint64_t h = mix(mix(mix(uint64_t(layer)) ^ uint64_t(g)) ^ uint64_t(e)), h2 = mix(h);
            const double u1 = double((h >> 11) + 1) * 0x1p-53, u2 = double(h2 >> 11) * 0x1p-53;
            phi[size_t(g * D * k + e)] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) / std::sqrt(double(k));
        }
    if (!factored(D)) {
        proj_by_ = phi;
        return;
    }
    // U_g: Cholesky of P = Phi_g Phi_g^T (D x D; positive definite: a Gaussian D x k, k > D, has rank D)
    proj_by_.assign(size_t(G * D * D), 0.0);
    std::vector<double> P((size_t)(D * D));
    for (int64_t g = 0; g < G; ++g) {
        const double* ph = phi.data() + g * D * k;
        for (int64_t a = 0; a < D; ++a)
            for (int64_t b = 0; b < D; ++b) {
                double s = 0;
                for (int64_t c = 0; c < k; ++c) s += ph[a * k + c] * ph[b * k + c];
                P[size_t(a * D + b)] = s;
            }
        double* U = proj_by_.data() + g * D * D;
        for (int64_t a = 0; a < D; ++a)
            for (int64_t b = 0; b <= a; ++b) {
                double s = P[size_t(a * D + b)];
                for (int64_t c = 0; c < b; ++c) s -= U[a * D + c] * U[b * D + c];
                U[a * D + b] = a == b ? std::sqrt(std::max(s, 1e-300)) : s / U[b * D + b];
            }
    }
}

void LeverageSketch::unrotate(const float* key, int64_t D, const std::vector<double>* rope, const double* cs, double* x) {
    for (int64_t d = 0; d < D; ++d) x[d] = double(key[d]);
    if (!rope) return;
    const int64_t half = int64_t(rope->size());
    for (int64_t j = 0; j < half; ++j) {  // R(p)^T: rotate pair (j, j + half) by -p theta_j
        const double c = cs[2 * j], s = cs[2 * j + 1];
        const double u = double(key[j]), v = double(key[j + half]);
        x[j] = u * c + v * s;
        x[j + half] = v * c - u * s;
    }
}

// A chunk stages one key per (row, new token): every row's key at position p takes the same
// rotation, so its sines and cosines are computed once per position, not once per row; past the
// run's first position p0 by angle addition from p0's and the offset's (t theta_j for t < 4097,
// the same every chunk: taken once per layer), where std::cos and std::sin per pair dominated.
// Within a few ulp of the direct ones (whose argument p theta_j is itself rounded).
const double* LeverageSketch::rotation(const std::vector<double>* rope, int64_t p) {
    const int64_t half = int64_t(rope->size());
    if (rope != rot_rope_ || p < rot_p0_ || p >= rot_p0_ + rot_n_) {
        if (rope != rot_rope_ || p < rot_p0_ || p > rot_p0_ + 4096) {  // a new run of positions
            rot_rope_ = rope, rot_p0_ = p, rot_n_ = 0;
            rot_ok_.clear();
        }
        rot_n_ = p - rot_p0_ + 1;
        rot_ok_.resize(size_t(rot_n_), 0);
        rot_.resize(size_t(rot_n_ * 2 * half));
    }
    double* cs = rot_.data() + (p - rot_p0_) * 2 * half;
    if (!rot_ok_[size_t(p - rot_p0_)]) {
        const int64_t t = p - rot_p0_;
        if (t == 0 || !rot_ok_[0]) {
            for (int64_t j = 0; j < half; ++j) {
                const double a = double(p) * (*rope)[size_t(j)];
                cs[2 * j] = std::cos(a), cs[2 * j + 1] = std::sin(a);
            }
        } else {
            if (*rope != step_freq_) step_freq_ = *rope, step_n_ = 0;
            if (t >= step_n_) {
                step_.resize(size_t((t + 1) * 2 * half));
                for (int64_t u = step_n_; u <= t; ++u)
                    for (int64_t j = 0; j < half; ++j) {
                        const double a = double(u) * (*rope)[size_t(j)];
                        step_[size_t((u * half + j) * 2)] = std::cos(a), step_[size_t((u * half + j) * 2 + 1)] = std::sin(a);
                    }
                step_n_ = t + 1;
            }
            const double *b = rot_.data(), *st = step_.data() + t * 2 * half;
            for (int64_t j = 0; j < half; ++j) {
                const double c0 = b[2 * j], s0 = b[2 * j + 1], ct = st[2 * j], sn = st[2 * j + 1];
                cs[2 * j] = c0 * ct - s0 * sn, cs[2 * j + 1] = s0 * ct + c0 * sn;
            }
        }
        rot_ok_[size_t(t)] = 1;
    }
    return cs;
}

void LeverageSketch::stage(const float* key, int64_t D, const std::vector<double>* rope, double p, int64_t r, int64_t slot) {
    staged_.resize(staged_.size() + size_t(D));
    unrotate(key, D, rope, rope ? rotation(rope, int64_t(p)) : nullptr, staged_.data() + staged_.size() - size_t(D));
    staged_at_.push_back(r), staged_at_.push_back(slot);
}

void LeverageSketch::flush(int64_t D, int64_t G, int64_t L, double* proj) {
    const int64_t n = int64_t(staged_at_.size() / 2), K = width(D);
    for (int64_t g = 0; g < G; ++g) {
        int64_t m = 0;
        X_.resize(size_t(n * D));
        for (int64_t i = 0; i < n; ++i)
            if (staged_at_[size_t(2 * i)] % G == g) std::copy_n(staged_.begin() + i * D, D, X_.begin() + (m++) * D);
        if (m == 0) continue;
        P_.resize(size_t(m * K));
        if (k > 0)
            policy_matmul_fma(m, K, D, X_.data(), D, 1, proj_by_.data() + g * D * K, K, P_.data(), K);
        else
            std::copy_n(X_.begin(), m * D, P_.begin());
        for (int64_t i = 0, j = 0; i < n; ++i)
            if (staged_at_[size_t(2 * i)] % G == g)
                std::copy_n(P_.begin() + (j++) * K, K, proj + (staged_at_[size_t(2 * i)] * L + staged_at_[size_t(2 * i + 1)]) * K);
    }
    staged_.clear();
    staged_at_.clear();
    rot_rope_ = nullptr;  // the next chunk's positions start a new run
}

void LeverageSketch::leverage(const double* proj, const int32_t* idx, int64_t m, int64_t K, double* out) {
    mean_.assign((size_t)K, 0.0);
    Y_.resize(size_t(m * K)), G_.resize(size_t(K * K)), Z_.resize(size_t(m * K)), LiT_.resize(size_t(K * K));
    Li_.assign(size_t(K * K), 0.0);
    double *mean = mean_.data(), *Y = Y_.data(), *Gm = G_.data(), *Li = Li_.data(), *Z = Z_.data(), *LiT = LiT_.data();
    // row by row, each column's sum in order (contiguous inner loops: vectorised)
    for (int64_t i = 0; i < m; ++i) {
        const double* p = proj + idx[i] * K;
        for (int64_t c = 0; c < K; ++c) mean[c] += p[c];
    }
    for (int64_t c = 0; c < K; ++c) mean[c] /= double(m);
    for (int64_t i = 0; i < m; ++i) {
        const double* p = proj + idx[i] * K;
        for (int64_t c = 0; c < K; ++c) Y[i * K + c] = p[c] - mean[c];
    }
    // the products with fused multiply-adds (policy_fma_math.h, f64 at the CPU's vector width)
    // Y^T Y, Y read transposed in place: the Cholesky below reads the lower triangle only, so each
    // block of 16 rows stops at its diagonal block (each entry is the same sum as in the whole product)
    for (int64_t a0 = 0; a0 < K; a0 += 16) {
        const int64_t rb = std::min<int64_t>(16, K - a0);
        policy_matmul_fma(rb, a0 + rb, m, Y + a0, 1, K, Y, K, Gm + a0 * K, K);
    }
    for (int64_t a = 0; a < K; ++a) Gm[a * K + a] += 1e-2;
    // Cholesky G = L L^T in place (lower triangle), then L^-1 by forward substitution
    for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b <= a; ++b) {
            double s = Gm[a * K + b];
            for (int64_t c = 0; c < b; ++c) s -= Gm[a * K + c] * Gm[b * K + c];
            Gm[a * K + b] = a == b ? std::sqrt(std::max(s, 1e-300)) : s / Gm[b * K + b];
        }
    // row a of L^-1 for every column c <= a at once (each entry's subtractions in the same
    // order, b ascending from c: the bits of the entry-at-a-time loop, in independent chains)
    double* t = Z_.data();  // scratch of K (Z is written only below)
    for (int64_t a = 0; a < K; ++a) {
        std::fill(t, t + a + 1, 0.0);
        t[a] = 1.0;
        for (int64_t b = 0; b < a; ++b) {
            const double coef = Gm[a * K + b];
            const double* lb = Li + b * K;
            for (int64_t c = 0; c <= b; ++c) t[c] -= coef * lb[c];
        }
        for (int64_t c = 0; c <= a; ++c) Li[a * K + c] = t[c] / Gm[a * K + a];
    }
    // y^T G^-1 y = |L^-1 y|^2: Z = Y L^-T, one row per token
    for (int64_t a = 0; a < K; ++a)
        for (int64_t b = 0; b < K; ++b) LiT[b * K + a] = Li[a * K + b];
    // L^-T is upper triangular: a block of 16 columns ends its sums at its last row b that is not
    // 0 (the terms left out are +-0 added last: the same |z|^2)
    for (int64_t a0 = 0; a0 < K; a0 += 16) {
        const int64_t cb = std::min<int64_t>(16, K - a0);
        policy_matmul_fma(m, cb, a0 + cb, Y, K, 1, LiT + a0, K, Z + a0, K);
    }
    // eight rows' sums side by side (each in a ascending: eight chains in flight)
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t a = 0; a < K; ++a)
            for (int64_t r = 0; r < 8; ++r) l[r] += Z[(i + r) * K + a] * Z[(i + r) * K + a];
        for (int64_t r = 0; r < 8; ++r) out[i + r] = std::max(l[r], 0.0);
    }
    for (; i < m; ++i) {
        double l = 0;
        for (int64_t a = 0; a < K; ++a) l += Z[i * K + a] * Z[i * K + a];
        out[i] = std::max(l, 0.0);
    }
}

void z_normalise(std::vector<double>& v) {
    if (v.empty()) return;
    double sum = 0;
    for (double x : v) sum += x;
    const double N = double(v.size()), mu = sum / N;
    double var = 0;
    for (double x : v) var += (x - mu) * (x - mu);
    const double sd = std::max(N > 1 ? std::sqrt(var / (N - 1)) : 0.0, 1e-6);
    for (double& x : v) x = (x - mu) / sd;
}

namespace {
class LeveragePolicy final : public ScorePolicy {
   public:
    LeveragePolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer) : ScorePolicy(cfg, L, G), layer_(layer) {
        sketch_.k = int64_t(cfg.policy_option("leverage_sketch"));
    }
    const char* name() const override { return "leverage"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::QueryVectors}; }  // queries: the RoPE frequencies that rotated the keys
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        proj_.clear();
        D_ = 0;
    }
    // the chunk's keys are projected together once placed (LeverageSketch::flush)
    void prefill(int64_t n, const InsertFeatures& f) override {
        ScorePolicy::prefill(n, f);
        sketch_.flush(D_, G_, L_, proj_.data());
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        ScorePolicy::apply(plan, f);
        sketch_.flush(D_, G_, L_, proj_.data());
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) {
            D_ = f.head_dim;
            K_ = sketch_.width(D_);
            proj_.assign(size_t(rows() * L_ * K_), 0.0);
            sketch_.init(layer_, G_, D_);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        sketch_.stage(f.keys.data() + i * D_, D_, f.rope_inv_freq, double(pos_[size_t(r * L_ + slot)]), r, slot);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(proj_.begin() + (r * L_ + from) * K_, K_, proj_.begin() + (r * L_ + to) * K_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        if (T_ < L_) return;  // scores are read only from a full cache (choose_next, slot_scores), each time recomputed
        const int64_t T = T_;
        std::vector<int32_t> idx((size_t)T);
        for (int64_t j = 0; j < T; ++j) idx[size_t(j)] = int32_t(j);
        std::vector<double> lev((size_t)(rows() * T));
        for (int64_t r = 0; r < rows(); ++r) sketch_.leverage(proj_.data() + r * L_ * K_, idx.data(), T, K_, lev.data() + r * T);
        z_normalise(lev);
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j) score_[size_t(r * L_ + j)] = float(lev[size_t(r * T + j)]);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t layer_, D_ = 0, K_ = 0;
    LeverageSketch sketch_;
    std::vector<float> score_;  // (B*G, L)
    std::vector<double> proj_;  // (B*G, L, K) pre-RoPE keys times the sketch
};
}  // namespace

std::vector<PolicyInfo> leverage_policies() {
    return {{.name = "leverage",
             .summary = "Leverage: approximate statistical leverage of the pre-RoPE keys (Gaussian sketch), z-normalised; no attention weights",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<LeveragePolicy>(a.cfg, a.L, a.G, a.layer); },
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "leverage_sketch", .help = "leverage: Gaussian sketch dimension (0: the keys themselves)", .def = 48, .lo = 0, .hi = 4096, .integer = true}},
             .doc_anchor = "docs/POLICIES.md#leverage"}};
}

}  // namespace kv
