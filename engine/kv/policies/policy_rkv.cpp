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
#include <cstring>
#include <limits>
#include <numeric>

#include "engine/backend/host_parallel.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
// Whether one of x[0, 32) is above t (no NaN in x): four-lane vectors (GCC's extension; SSE2 on
// every x86-64), which the scalar loop's early exit keeps GCC from forming.
inline bool any_above(const float* x, float t) {
    typedef float f4 __attribute__((vector_size(16)));
    typedef int i4 __attribute__((vector_size(16)));
    i4 m = {0, 0, 0, 0};
    for (int u = 0; u < 32; u += 4) {
        f4 v;
        std::memcpy(&v, x + u, sizeof(v));
        m |= v > t;
    }
    return (m[0] | m[1] | m[2] | m[3]) != 0;
}

class RKVPolicy final : public ScorePolicy {
   public:
    RKVPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G),
          window_(int64_t(cfg.policy_option("rkv_window"))),
          kernel_(int64_t(cfg.policy_option("rkv_kernel"))),
          lambda_(cfg.policy_option("rkv_lambda")),
          threshold_(cfg.policy_option("rkv_threshold")) {
        if (kernel_ % 2 == 0) throw Error(str("--kv_cache.rkv_kernel: ", kernel_, " must be an odd number >= 1"));
        // the largest float <= the threshold: for a float x, double(x) > threshold iff x > it
        thr_below_ = float(threshold_);
        if (double(thr_below_) > threshold_) thr_below_ = std::nextafter(thr_below_, -std::numeric_limits<float>::infinity());
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
            order.resize(size_t(T)), imp.resize(size_t(T)), red.resize(size_t(T));
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
            // sum_j S_ij over j != i is u_i . (sum_j u_j) - u_i . u_i, in f64 from the f32 unit
            // keys: O(T D) instead of every product. The exemption needs the newest j with
            // S_ij > threshold: blocks of kBlock slots, newest first, against the slots i still
            // without one (each S_ij an f32 sum over d in order, policy_matmul), until every i
            // has one or the oldest block is done. kvpress' threshold makes most keys find one
            // among the newest few hundred.
            const float* U = unit_.data() + r * L_ * D_;
            std::vector<double>& su = sc.unit_sum;
            su.assign(size_t(D_), 0.0);
            for (int64_t j = 0; j < T; ++j)
                for (int64_t d = 0; d < D_; ++d) su[size_t(d)] += double(U[j * D_ + d]);
            sum_.resize(size_t(T)), newest_.assign(size_t(T), -1.0), exempt_.assign(size_t(T), 0.0);
            for (int64_t i = 0; i < T; ++i) {
                double dot = 0, self = 0;
                for (int64_t d = 0; d < D_; ++d) {
                    const double u = double(U[i * D_ + d]);
                    dot += u * su[size_t(d)], self += u * u;
                }
                sum_[size_t(i)] = dot - self;
            }
            std::vector<int32_t>& act = sc.active;  // slots i still looking, their unit keys the rows of A
            act.resize(size_t(T));
            std::iota(act.begin(), act.end(), 0);
            std::vector<float>&A = sc.rows, &Bt = sc.block, &P = sc.products;
            A.assign(U, U + T * D_);
            Bt.resize(size_t(D_ * kBlock)), P.resize(size_t(T * kBlock));
            int32_t js[kBlock];
            for (int64_t k1 = T; k1 > 0 && !act.empty(); k1 -= kBlock) {
                const int64_t jb = std::min(kBlock, k1), na = int64_t(act.size());
                for (int64_t t = 0; t < jb; ++t) {  // the block's slots, newest first, transposed (D x kBlock)
                    js[t] = order[size_t(k1 - 1 - t)];
                    for (int64_t d = 0; d < D_; ++d) Bt[size_t(d * kBlock + t)] = U[js[t] * D_ + d];
                }
                policy_matmul(na, jb, D_, A.data(), D_, Bt.data(), kBlock, P.data(), kBlock);
                int64_t w = 0;
                for (int64_t a = 0; a < na; ++a) {
                    const int32_t i = act[size_t(a)];
                    const float* pa = P.data() + a * kBlock;
                    int64_t t = jb;
                    if (jb == kBlock) {  // most rows meet no similar key in a block: one vector test first
                        if (any_above(pa, thr_below_)) t = 0;
                    } else {
                        t = 0;
                    }
                    while (t < jb && (js[t] == i || !(double(pa[t]) > threshold_))) ++t;
                    if (t < jb) {
                        newest_[size_t(i)] = double(pos[js[t]]), exempt_[size_t(i)] = double(pa[t]);
                        continue;
                    }
                    if (w != a) std::copy_n(A.data() + a * D_, D_, A.data() + w * D_);
                    act[size_t(w++)] = i;
                }
                act.resize(size_t(w));
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
    float thr_below_ = 0;
    int64_t D_ = 0;
    std::vector<float> score_;  // (B*G, L)
    std::vector<float> unit_;   // (B*G, L, D) unit keys
    static constexpr int64_t kBlock = 32;  // slots j per product of the exemption search (any_above's width)
    struct Scratch {  // one row's, per thread
        std::vector<float> rows, block, products;  // unit keys of the slots still searching; a block's (D, kBlock); their products
        std::vector<double> unit_sum;              // sum_j u_j (D)
        std::vector<double> sum, newest, exempt;   // per slot i, sum_j S_ij, the newest similar key's position and S
        std::vector<double> imp, red;              // per slot: importance, redundancy
        std::vector<int32_t> order, active;        // slots in position order; slots still searching
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
