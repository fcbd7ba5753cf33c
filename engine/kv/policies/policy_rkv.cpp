// rkv (R-KV, Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning
// Models"; defaults of kvpress' RkvPress): a token is worth keeping when the newest queries
// attend to it (importance) and no other cached key says the same (redundancy). Per (b, g) row,
// after every chunk:
//   I_j = max-pool over rkv_kernel neighbours (token-position order, -inf padding) of the mean
//         attention weight of the chunk's last rkv_window queries on slot j;
//   S_ij = cos(k_i, k_j) for i != j, 0 on the diagonal; for each i the most recent j with
//         S_ij > rkv_threshold is exempt (S_ij = 0): the newest copy of a repeated key is kept;
//   R = softmax over slots of (1/T) sum_j S_ij;
//   score_j = rkv_lambda I_j - (1 - rkv_lambda) R_j, and the rkv_window newest tokens score the
//         row's maximum (kept, as the press's window).
// Keys are kept as unit vectors per slot (+4 D bytes per slot per row, beside the buffer).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/backend/host_parallel.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/policy_similarity_scan.h"

namespace kv {

namespace {
class RKVPolicy final : public ScorePolicy {
   public:
    RKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          window_(int64_t(cfg.policy_option("rkv_window"))),
          kernel_(int64_t(cfg.policy_option("rkv_kernel"))),
          lambda_(cfg.policy_option("rkv_lambda")),
          threshold_(cfg.policy_option("rkv_threshold")) {
        if (kernel_ % 2 == 0) throw Error(str("--kv_cache.rkv_kernel: ", kernel_, " must be an odd number >= 1"));
    }
    const char* name() const override { return "rkv"; }
    bool needs_attention_weights() const override { return true; }
    int64_t weights_query_window() const override { return window_; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        unit_.clear();
        D_ = 0;
    }

   protected:
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (D_ == 0) {
            D_ = f.head_dim;
            unit_.assign(size_t(rows() * L_ * D_), 0.0f);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        const float* k = f.keys.data() + i * D_;
        double n2 = 0;
        for (int64_t d = 0; d < D_; ++d) n2 += double(k[d]) * double(k[d]);
        const double inv = 1.0 / (std::sqrt(n2) + 1e-8);
        float* u = unit_.data() + (r * L_ + slot) * D_;
        for (int64_t d = 0; d < D_; ++d) u[d] = float(double(k[d]) * inv);
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        std::copy_n(unit_.begin() + (r * L_ + from) * D_, D_, unit_.begin() + (r * L_ + to) * D_);
    }
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (w.empty()) return;
        const int64_t T = T_, half = kernel_ / 2, nq = std::min(window_, n);
        // Rows are independent (each writes only its own scores): one per thread, each with its
        // own scratch, so the bits do not depend on the thread count.
        host_parallel_units(rows(), [&](int64_t r) {
            Scratch& sc = scratch();
            std::vector<int32_t>& order = sc.order;
            std::vector<double>&imp = sc.imp, &red = sc.red, &sum_ = sc.sum, &newest_ = sc.newest, &exempt_ = sc.exempt;
            std::vector<float>&ut_ = sc.ut, &sim_ = sc.sim;
            order.resize(size_t(T)), imp.resize(size_t(T)), red.resize(size_t(T));
            ut_.resize(size_t(D_ * T));
            sim_.resize(size_t(kBlock * T));
            const int32_t* pos = pos_.data() + r * L_;
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [pos](int32_t a, int32_t b) { return pos[a] < pos[b]; });
            // importance: mean weight of the window's queries, max-pooled in position order
            for (int64_t i = 0; i < T; ++i) {
                double m = -std::numeric_limits<double>::infinity();
                for (int64_t k = std::max<int64_t>(0, i - half); k <= std::min(T - 1, i + half); ++k)
                    m = std::max(m, double(w[size_t(r * T + order[size_t(k)])]) / double(nq));
                imp[size_t(order[size_t(i)])] = m;
            }
            // redundancy: mean cosine similarity, the most recent similar key exempt, softmax.
            // The similarities are f32 products of unit keys (|error| ~ 1e-7), each one sum over d
            // in order (policy_matmul), so S_ij and S_ji have the same bits. Each i's sum and its
            // newest similar key run over j in slot order in f64, every i side by side
            // (policy_similarity_columns); the diagonal adds 0 and exempts nothing.
            const float* U = unit_.data() + r * L_ * D_;
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D_; ++d) ut_[size_t(d * T + j)] = U[j * D_ + d];
            sum_.assign(size_t(T), 0.0), newest_.assign(size_t(T), -1.0), exempt_.assign(size_t(T), 0.0);
            if (T <= kFullT) {
                // Panel b holds S_j,i for the block's slots i, every j (T x kBlock). Only rows
                // j >= the block's first slot are products; the rows before are the transposed
                // tiles of the earlier panels (S_ji = S_ij: half the products).
                std::vector<float>& S = full_scratch();
                const int64_t nb = (T + kBlock - 1) / kBlock;
                S.resize(size_t(nb * T * kBlock));
                for (int64_t b = 0, i0 = 0; b < nb; ++b, i0 += kBlock) {
                    const int64_t m = std::min(kBlock, T - i0);
                    float* Pb = S.data() + b * T * kBlock;
                    policy_matmul(T - i0, m, D_, U + i0 * D_, D_, ut_.data() + i0, T, Pb + i0 * kBlock, kBlock);
                    for (int64_t e = 0; e < b; ++e) {  // earlier blocks are whole
                        const float* Pe = S.data() + e * T * kBlock;
                        for (int64_t jj = 0; jj < kBlock; ++jj)
                            for (int64_t ii = 0; ii < m; ++ii)
                                Pb[(e * kBlock + jj) * kBlock + ii] = Pe[(i0 + ii) * kBlock + jj];
                    }
                    policy_similarity_columns(Pb, kBlock, T, m, i0, pos, threshold_, sum_.data() + i0, newest_.data() + i0,
                                              exempt_.data() + i0);
                }
            } else {
                // blocks of kBlock slots i, laid out (T, block): the block's state stays in L1
                for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
                    const int64_t m = std::min(kBlock, T - i0);
                    policy_matmul(T, m, D_, U, D_, ut_.data() + i0, T, sim_.data(), m);
                    policy_similarity_columns(sim_.data(), m, T, m, i0, pos, threshold_, sum_.data() + i0, newest_.data() + i0,
                                              exempt_.data() + i0);
                }
            }
            double zmax = -std::numeric_limits<double>::infinity();
            for (int64_t i = 0; i < T; ++i) {
                red[size_t(i)] = (sum_[size_t(i)] - exempt_[size_t(i)]) / double(T);
                zmax = std::max(zmax, red[size_t(i)]);
            }
            double z = 0;
            for (int64_t i = 0; i < T; ++i) z += std::exp(red[size_t(i)] - zmax);
            float top = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < T; ++j) {
                const double R = std::exp(red[size_t(j)] - zmax) / z;
                const float s = float(lambda_ * imp[size_t(j)] - (1.0 - lambda_) * R);
                score_[size_t(r * L_ + j)] = s;
                top = std::max(top, s);
            }
            for (int64_t j = 0; j < T; ++j)  // the newest rkv_window tokens are kept
                if (pos[j] >= P_ - window_) score_[size_t(r * L_ + j)] = top;
        });
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t window_, kernel_;
    double lambda_, threshold_;
    int64_t D_ = 0;
    std::vector<float> score_;  // (B*G, L)
    std::vector<float> unit_;   // (B*G, L, D) unit keys
    static constexpr int64_t kBlock = 32;  // similarity rows per product (32 x T f32 stays in L2)
    static constexpr int64_t kFullT = 2048;  // up to this many slots, every panel (T^2 f32: 16 MiB) in one scratch per thread
    static std::vector<float>& full_scratch() { return scratch().full; }
    struct Scratch {  // one row's, per thread
        std::vector<float> full;      // every panel of the row's similarities (T <= kFullT)
        std::vector<float> ut, sim;   // the row's unit keys transposed (D, T); a block of similarities (T, block)
        std::vector<double> sum, newest, exempt;  // per slot i, sum_j S_ij, the newest similar key's position and S
        std::vector<double> imp, red;  // per slot: importance, redundancy
        std::vector<int32_t> order;    // slots in position order
    };
    static Scratch& scratch() {
        static thread_local Scratch s;
        return s;
    }
};
}  // namespace

std::vector<PolicyInfo> rkv_policies() {
    return {{.name = "rkv",
             .summary = "R-KV: window attention (max-pooled) minus key redundancy (cosine similarity)",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<RKVPolicy>(a.cfg, a.L, a.G); },
             .needs_attention_weights = true,
             .uses = {"grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "rkv_window", .help = "rkv: newest queries that vote and newest tokens kept", .def = 8, .lo = 1, .hi = 1 << 20, .integer = true},
                         {.name = "rkv_kernel", .help = "rkv: max-pooling width of the importance (odd)", .def = 7, .lo = 1, .hi = 1001, .integer = true},
                         {.name = "rkv_lambda", .help = "rkv: weight of importance against redundancy", .def = 0.07, .lo = 0, .hi = 1, .integer = false},
                         {.name = "rkv_threshold", .help = "rkv: cosine similarity above which keys are redundant", .def = 0.5, .lo = -1, .hi = 1, .integer = false}},
             .doc_anchor = "docs/POLICIES.md#rkv"}};
}

}  // namespace kv
