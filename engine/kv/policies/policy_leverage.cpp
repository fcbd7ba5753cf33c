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
// chunk; a sketch wider than the key is applied in the key's space, LeverageSketch::leverage);
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
    phit_.clear();
    d_ = D;
    if (k == 0) return;
    // Phi[g][d][c] = N(0, 1) / sqrt(k) by Box-Muller from two splitmix64 draws
    phi.assign(size_t(G * D * k), 0.0);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t e = 0; e < D * k; ++e) {
            const uint64_t h = mix(mix(mix(uint64_t(layer)) ^ uint64_t(g)) ^ uint64_t(e)), h2 = mix(h);
            const double u1 = double((h >> 11) + 1) * 0x1p-53, u2 = double(h2 >> 11) * 0x1p-53;
            phi[size_t(g * D * k + e)] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) / std::sqrt(double(k));
        }
    if (!in_key_space(D)) return;
    phit_.resize(phi.size());
    for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d)
            for (int64_t c = 0; c < k; ++c) phit_[size_t((g * k + c) * D + d)] = phi[size_t((g * D + d) * k + c)];
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
// rotation, so its sines and cosines are computed once per position, not once per row.
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
        for (int64_t j = 0; j < half; ++j) {
            const double a = double(p) * (*rope)[size_t(j)];
            cs[2 * j] = std::cos(a), cs[2 * j + 1] = std::sin(a);
        }
        rot_ok_[size_t(p - rot_p0_)] = 1;
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
        if (k > 0 && !in_key_space(D))
            policy_matmul_fma(m, K, D, X_.data(), D, 1, phi.data() + g * D * K, K, P_.data(), K);
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

void LeverageSketch::leverage(const double* proj, const int32_t* idx, int64_t m, int64_t K, double* out, int64_t g) {
    if (k > 0 && d_ == K && in_key_space(K) && !phit_.empty()) return leverage_key_space(proj, idx, m, K, out, g);
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

// Cholesky A = L L^T of the lower triangle of A (n x n, in place), each pivot clamped at 1e-300.
static void cholesky_lower(double* A, int64_t n) {
    for (int64_t a = 0; a < n; ++a)
        for (int64_t b = 0; b <= a; ++b) {
            double s = A[a * n + b];
            for (int64_t c = 0; c < b; ++c) s -= A[a * n + c] * A[b * n + c];
            A[a * n + b] = a == b ? std::sqrt(std::max(s, 1e-300)) : s / A[b * n + b];
        }
}

void LeverageSketch::leverage_key_space(const double* keys, const int32_t* idx, int64_t m, int64_t D, double* out, int64_t g) {
    mean_.assign((size_t)D, 0.0);
    Y_.resize(size_t(m * D)), S_.resize(size_t(D * D)), T1_.resize(size_t(D * k)), G_.resize(size_t(k * k)), W_.resize(size_t(k * D));
    Z_.resize(size_t(m * D));
    Li_.assign(size_t(k * k), 0.0);
    double *mean = mean_.data(), *X = Y_.data(), *S = S_.data(), *T1 = T1_.data(), *H = G_.data(), *Li = Li_.data(), *W = W_.data(),
           *Z = Z_.data();
    const double* ph = phi.data() + g * D * k;     // (D, k)
    const double* pht = phit_.data() + g * k * D;  // (k, D)
    for (int64_t i = 0; i < m; ++i) {
        const double* p = keys + idx[i] * D;
        for (int64_t c = 0; c < D; ++c) mean[c] += p[c];
    }
    for (int64_t c = 0; c < D; ++c) mean[c] /= double(m);
    for (int64_t i = 0; i < m; ++i) {
        const double* p = keys + idx[i] * D;
        for (int64_t c = 0; c < D; ++c) X[i * D + c] = p[c] - mean[c];
    }
    // S = X^T X: blocks of 16 rows up to their diagonal block, the upper triangle mirrored
    for (int64_t a0 = 0; a0 < D; a0 += 16) {
        const int64_t rb = std::min<int64_t>(16, D - a0);
        policy_matmul_fma(rb, a0 + rb, m, X + a0, 1, D, X, D, S + a0 * D, D);
    }
    for (int64_t a = 0; a < D; ++a)
        for (int64_t b = a + 1; b < D; ++b) S[a * D + b] = S[b * D + a];
    // H = Phi^T S Phi + 0.01 I (k x k), H = L L^T
    policy_matmul_fma(D, k, D, S, D, 1, ph, k, T1, k);
    policy_matmul_fma(k, k, D, pht, D, 1, T1, k, H, k);
    for (int64_t a = 0; a < k; ++a) H[a * k + a] += 1e-2;
    cholesky_lower(H, k);
    // L^-1 by forward substitution (row a for every column c <= a at once), W = L^-1 Phi^T
    double* t = T1;  // scratch of k <= D k (T1 is read only above)
    for (int64_t a = 0; a < k; ++a) {
        std::fill(t, t + a + 1, 0.0);
        t[a] = 1.0;
        for (int64_t b = 0; b < a; ++b) {
            const double coef = H[a * k + b];
            const double* lb = Li + b * k;
            for (int64_t c = 0; c <= b; ++c) t[c] -= coef * lb[c];
        }
        for (int64_t c = 0; c <= a; ++c) Li[a * k + c] = t[c] / H[a * k + a];
    }
    for (int64_t a0 = 0; a0 < k; a0 += 16) {  // L^-1 is lower triangular: row block a0 ends its sums at a0 + rb
        const int64_t rb = std::min<int64_t>(16, k - a0);
        policy_matmul_fma(rb, D, a0 + rb, Li + a0 * k, k, 1, pht, D, W + a0 * D, D);
    }
    // M = W^T W = C C^T (D x D, in S), l = |C^T x|^2 = |x C|^2
    policy_matmul_fma(D, D, k, W, 1, D, W, D, S, D);
    cholesky_lower(S, D);
    for (int64_t a = 0; a < D; ++a)
        for (int64_t b = a + 1; b < D; ++b) S[a * D + b] = 0.0;
    // (x C)_a sums over b >= a: a block of 16 columns starts its sums at its first row a0
    for (int64_t a0 = 0; a0 < D; a0 += 16) {
        const int64_t cb = std::min<int64_t>(16, D - a0);
        policy_matmul_fma(m, cb, D - a0, X + a0, D, 1, S + a0 * D + a0, D, Z + a0, D);
    }
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
        double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t a = 0; a < D; ++a)
            for (int64_t r = 0; r < 8; ++r) l[r] += Z[(i + r) * D + a] * Z[(i + r) * D + a];
        for (int64_t r = 0; r < 8; ++r) out[i + r] = std::max(l[r], 0.0);
    }
    for (; i < m; ++i) {
        double l = 0;
        for (int64_t a = 0; a < D; ++a) l += Z[i * D + a] * Z[i * D + a];
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
        for (int64_t r = 0; r < rows(); ++r) sketch_.leverage(proj_.data() + r * L_ * K_, idx.data(), T, K_, lev.data() + r * T, r % G_);
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
