// leverage (kvpress' LeverageScorePress, the geometric half of Compactor: Chari & Van Durme
// 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage
// Scores"): keys that are statistical outliers of their head carry information the others do
// not, so a token scores its key's approximate leverage. After every chunk, per (b, g) row
// over the T cached pre-RoPE keys:
//   X = K - mean_j k_j (T x D),  Y = X Phi (T x k, Phi a fixed Gaussian sketch, 0: Y = X)
//   l_j = max(0, y_j^T (Y^T Y + 0.01 I)^-1 y_j)      (Cholesky; kvpress' first jitter)
//   score_j = (l_j - mean l) / max(std l, 1e-6)        over every cached token of the layer
// Keys are un-rotated with the layer's RoPE frequencies when written and kept per slot. Phi's
// entries are a documented pure function of (layer, head, index) (docs/POLICIES.md#leverage),
// where kvpress draws a fresh torch.randn per call.
#include <algorithm>
#include <cmath>

#include "policy_score_based.h"

namespace kv {

namespace {
uint64_t mix(uint64_t z) {  // splitmix64's finalizer (as random's draws)
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class LeveragePolicy final : public ScorePolicy {
   public:
    LeveragePolicy(const KVCacheConfig& cfg, int64_t L, int64_t G, int64_t layer)
        : ScorePolicy(cfg, L, G), k_(int64_t(cfg.policy_option("leverage_sketch"))), layer_(layer) {}
    const char* name() const override { return "leverage"; }
    bool needs_key_vectors() const override { return true; }
    bool needs_query_vectors() const override { return true; }  // for the RoPE frequencies that rotated the keys
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        keys_.clear();
        D_ = 0;
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) init(f.head_dim);
        score_[size_t(r * L_ + slot)] = 0.0f;
        const float* k = f.keys.data() + i * D_;
        double* x = keys_.data() + (r * L_ + slot) * D_;
        for (int64_t d = 0; d < D_; ++d) x[d] = double(k[d]);
        if (!f.rope_inv_freq) return;
        const int64_t half = int64_t(f.rope_inv_freq->size());
        const double p = double(pos_[size_t(r * L_ + slot)]);
        for (int64_t j = 0; j < half; ++j) {  // R(p)^T: rotate pair (j, j + half) by -p theta_j
            const double a = p * (*f.rope_inv_freq)[size_t(j)], c = std::cos(a), s = std::sin(a);
            const double u = double(k[j]), v = double(k[j + half]);
            x[j] = u * c + v * s;
            x[j + half] = v * c - u * s;
        }
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(keys_.begin() + (r * L_ + from) * D_, D_, keys_.begin() + (r * L_ + to) * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        const int64_t T = T_, K = k_ > 0 ? k_ : D_;
        std::vector<double> mean((size_t)D_), Y((size_t)(T * K)), Gm((size_t)(K * K)), z((size_t)K), lev((size_t)(rows() * T));
        for (int64_t r = 0; r < rows(); ++r) {
            const double* X = keys_.data() + r * L_ * D_;
            std::fill(mean.begin(), mean.end(), 0.0);
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D_; ++d) mean[size_t(d)] += X[j * D_ + d] / double(T);
            const double* Phi = phi_.data() + (r % G_) * D_ * K;
            for (int64_t j = 0; j < T; ++j)
                for (int64_t c = 0; c < K; ++c) {
                    double s = 0;
                    if (k_ > 0)
                        for (int64_t d = 0; d < D_; ++d) s += (X[j * D_ + d] - mean[size_t(d)]) * Phi[d * K + c];
                    else
                        s = X[j * D_ + c] - mean[size_t(c)];
                    Y[size_t(j * K + c)] = s;
                }
            // G = Y^T Y + 0.01 I, then its Cholesky factor in place (lower triangle)
            for (int64_t a = 0; a < K; ++a)
                for (int64_t b = 0; b <= a; ++b) {
                    double s = a == b ? 1e-2 : 0.0;
                    for (int64_t j = 0; j < T; ++j) s += Y[size_t(j * K + a)] * Y[size_t(j * K + b)];
                    Gm[size_t(a * K + b)] = s;
                }
            for (int64_t a = 0; a < K; ++a) {
                for (int64_t b = 0; b <= a; ++b) {
                    double s = Gm[size_t(a * K + b)];
                    for (int64_t c = 0; c < b; ++c) s -= Gm[size_t(a * K + c)] * Gm[size_t(b * K + c)];
                    Gm[size_t(a * K + b)] = a == b ? std::sqrt(std::max(s, 1e-300)) : s / Gm[size_t(b * K + b)];
                }
            }
            for (int64_t j = 0; j < T; ++j) {  // y^T G^-1 y = |L^-1 y|^2
                double l = 0;
                for (int64_t a = 0; a < K; ++a) {
                    double s = Y[size_t(j * K + a)];
                    for (int64_t c = 0; c < a; ++c) s -= Gm[size_t(a * K + c)] * z[size_t(c)];
                    z[size_t(a)] = s / Gm[size_t(a * K + a)];
                    l += z[size_t(a)] * z[size_t(a)];
                }
                lev[size_t(r * T + j)] = std::max(l, 0.0);
            }
        }
        double sum = 0;
        for (double x : lev) sum += x;
        const double N = double(lev.size()), mu = sum / N;
        double var = 0;
        for (double x : lev) var += (x - mu) * (x - mu);
        const double sd = std::max(N > 1 ? std::sqrt(var / (N - 1)) : 0.0, 1e-6);  // torch's unbiased std
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j) score_[size_t(r * L_ + j)] = float((lev[size_t(r * T + j)] - mu) / sd);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    void init(int64_t D) {
        D_ = D;
        keys_.assign(size_t(rows() * L_ * D_), 0.0);
        if (k_ == 0) return;
        // Phi[g][d][c] = N(0, 1) / sqrt(k) by Box-Muller from two splitmix64 draws
        phi_.assign(size_t(G_ * D_ * k_), 0.0);
        for (int64_t g = 0; g < G_; ++g)
            for (int64_t e = 0; e < D_ * k_; ++e) {
                const uint64_t h = mix(mix(mix(uint64_t(layer_)) ^ uint64_t(g)) ^ uint64_t(e)), h2 = mix(h);
                const double u1 = double((h >> 11) + 1) * 0x1p-53, u2 = double(h2 >> 11) * 0x1p-53;
                phi_[size_t(g * D_ * k_ + e)] = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2) / std::sqrt(double(k_));
            }
    }

    int64_t k_, layer_, D_ = 0;
    std::vector<float> score_;   // (B*G, L)
    std::vector<double> keys_;   // (B*G, L, D) pre-RoPE keys
    std::vector<double> phi_;    // (G, D, k) the sketch
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
