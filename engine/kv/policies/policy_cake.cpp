// cake (CAKE, Qin et al., ICLR 2025, "CAKE: Cascading and Adaptive KV Cache Eviction with Layer
// Preferences"; the authors' reference code cakekv): each layer gets its own share of one total
// budget from how its attention behaves, and evicts by an indicator that values tokens whose
// attention shifts over time. With a[h, i, j] the softmax weight of window query i of head h on
// token j (window: the last w queries):
//   preference  P_l = H_l^(1/tau1) V_l^(1/tau2),  H_l = -sum a log(a + 1e-10) and
//               V_l = sum_j var_i a[h, i, j] over the tokens before the window (all heads, rows)
//   budgets     B_l = w + P_l / sum P * (total - N w)   (cake_layer_budgets: with floors)
//   indicator   s_j = pool_5( mean over the group's heads of mean_i a + gamma var_i a )
// Lengths are decided in our chunked driver as follows (docs/POLICIES.md#cake): every layer
// starts at one short length F (the prefill: chunk plans put F first); each layer measures P_l
// on its prefill; once the last layer has, the budgets are fixed for the rest of the sequence
// (floors: F, and what a layer already holds), and each layer's buffer is resized to its budget
// at its next call. Later chunks fill a layer to its budget, then evict the lowest indicators,
// never one of the w most recent tokens. The policy computes the window's softmax itself (the
// layer's weight sums have no variance), from the chunk's queries and a copy of the cached keys
// (4 D bytes per slot and row, beside the buffer, as rkv).
#include "engine/kv/policies/policy_cake.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "engine/core/error.h"
#include "engine/kv/policies/layer_budget_policy.h"
#include "engine/kv/policies/policy_cake_math.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

std::vector<int64_t> cake_layer_budgets(const std::vector<double>& pref, const std::vector<int64_t>& floors, int64_t total,
                                        int64_t window) {
    const size_t N = pref.size();
    if (floors.size() != N) throw Error(str("cake budgets: ", floors.size(), " floors for ", N, " layers"));
    int64_t fsum = 0;
    for (int64_t f : floors) fsum += f;
    if (N == 0 || fsum >= total) return floors;
    std::vector<double> p = pref;
    double psum = 0;
    for (double x : p) psum += x;
    if (!(psum > 0) || !std::isfinite(psum)) std::fill(p.begin(), p.end(), 1.0);
    // Water-filling: layers whose proportional share falls below their floor are pinned there,
    // and the rest is shared again among the others until none falls below.
    std::vector<char> pinned(N, 0);
    std::vector<double> real(N);
    for (;;) {
        double rest = double(total), pa = 0;
        int64_t free_layers = 0;
        for (size_t l = 0; l < N; ++l) {
            if (pinned[l]) rest -= double(floors[l]);
            else rest -= double(window), pa += p[l], ++free_layers;
        }
        bool changed = false;
        for (size_t l = 0; l < N; ++l) {
            if (pinned[l]) {
                real[l] = double(floors[l]);
                continue;
            }
            real[l] = double(window) + (pa > 0 ? rest * p[l] / pa : rest / double(free_layers));
            if (real[l] < double(floors[l])) pinned[l] = 1, changed = true;
        }
        if (!changed) break;
    }
    std::vector<int64_t> b(N);
    int64_t sum = 0;
    for (size_t l = 0; l < N; ++l) sum += b[l] = std::max(floors[l], int64_t(std::floor(real[l])));
    std::vector<size_t> order(N);
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return real[x] - std::floor(real[x]) > real[y] - std::floor(real[y]); });
    for (size_t k = 0; sum < total; k = (k + 1) % N) ++b[order[k]], ++sum;
    for (size_t k = N; sum > total && k-- > 0;)  // rounding error only: take back from the smallest fractions
        if (b[order[k]] > floors[order[k]]) --b[order[k]], --sum;
    return b;
}

namespace {

int64_t cake_initial_length(const KVCacheConfig& c, int64_t num_layers) {
    // Its prefill must hold a window and something before it.
    return grow_only_initial_length(c, num_layers, c.policy_option("cake_floor_fraction"), c.snapkv_window + 1);
}

class CakePolicy final : public LayerBudgetPolicy {
   public:
    CakePolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : LayerBudgetPolicy(L, G, cfg.cache_length > 0 ? cfg.cache_length : L),
          total_(int64_t(cfg.policy_option("cake_total_budget"))),
          window_(std::max<int64_t>(1, std::min<int64_t>(cfg.snapkv_window, L / 2))),
          kernel_(cfg.snapkv_kernel),
          tau1_(cfg.policy_option("cake_tau1")),
          tau2_(cfg.policy_option("cake_tau2")),
          gamma_(cfg.policy_option("cake_gamma")) {
        if (!cfg.layer_cache_lengths.empty() || !cfg.layer_cache_rule.empty())
            throw Error("--kv_cache.layer_cache_lengths: policy 'cake' decides every layer's length itself; leave it empty and "
                        "give --kv_cache.cache_length (the mean) or --kv_cache.cake_total_budget");
        if (L < 2) throw Error(str("--kv_cache.cache_length: ", L, " is too short for cake; expected at least 2 slots per layer"));
    }
    const char* name() const override { return "cake"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::QueryVectors}; }
    bool per_row_positions() const override { return true; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }

    void reset(int64_t batch) override {
        B_ = batch;
        T_ = P_ = 0;
        D_ = 0;
        relayout(initial_length());
        std::fill(pos_.begin(), pos_.end(), -1);
        std::fill(score_.begin(), score_.end(), 0.0f);
        pref_ = 0;
    }

    int64_t max_forward_length() const override {
        if (P_ > 0 && decided()) return budget();
        return P_ > 0 ? std::numeric_limits<int32_t>::max() : L_;  // undecided: a layer grows to take any chunk
    }

    void prefill(int64_t n, const InsertFeatures& f) override {
        if (n < 1 || n > L_) throw_chunk_error(name(), n, L_, 0, L_, "a prefill must fit the cache");
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t t = 0; t < n; ++t) {
                pos_[size_t(r * L_ + t)] = int32_t(t);
                store_key(r, t, f, r * n + t);
            }
        T_ = P_ = n;
        // The preference's window leaves at least one token before it.
        stash_window(f, n, std::min(window_, n - 1), 0);
        score_rows(true);
        say({pref_});
    }

    SlotPlan prepare(int64_t n) const override {
        if (P_ == 0) throw Error(str(name(), " cache: the first call of a sequence must be a prefill"));
        if (n < 1 || n > std::min(max_forward_length(), L_))
            throw_chunk_error(name(), n, std::min(max_forward_length(), L_), T_, L_, "the chunk is longer than the layer's budget");
        SlotPlan p;
        p.input_pos = P_;
        p.n = n;
        p.length_after = std::min(L_, T_ + n);
        const int64_t fresh = std::min(n, L_ - T_);
        if (fresh == n) {  // filling: free slots [T, T+n), the same for every row
            p.rows = 1;
            for (int64_t t = 0; t < n; ++t) p.targets.push_back(int32_t(T_ + t));
            return p;
        }
        // Free slots first, then the lowest indicators (ties: the lower slot) among tokens that
        // will not be among the w most recent after this chunk.
        p.rows = rows();
        p.targets.resize(size_t(rows() * n));
        const int64_t evict = n - fresh;
        const int64_t limit = P_ + n - window_;
        std::vector<int32_t> cand;
        for (int64_t r = 0; r < rows(); ++r) {
            const int32_t* pos = pos_.data() + r * L_;
            const float* s = score_.data() + r * L_;
            cand.clear();
            for (int64_t j = 0; j < T_; ++j)
                if (pos[j] < limit) cand.push_back(int32_t(j));
            if (int64_t(cand.size()) < evict)
                throw_chunk_error(name(), n, fresh + int64_t(cand.size()), T_, L_, "too few tokens outside the observation window");
            auto less = [s](int32_t a, int32_t b) { return s[a] < s[b] || (s[a] == s[b] && a < b); };
            std::partial_sort(cand.begin(), cand.begin() + evict, cand.end(), less);
            for (int64_t t = 0; t < fresh; ++t) p.targets[size_t(r * n + t)] = int32_t(T_ + t);
            for (int64_t t = 0; t < evict; ++t) p.targets[size_t(r * n + fresh + t)] = cand[size_t(t)];
        }
        return p;
    }

    void apply(const SlotPlan& p, const InsertFeatures& f) override {
        if (p.moves != 0) throw Error(str(name(), " cache: a plan with moves (", p.moves, ") is not one of cake's"));
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t pr = p.rows == 1 ? 0 : r;
            for (int64_t t = 0; t < p.n; ++t) {
                const int32_t slot = p.targets[size_t(pr * p.n + t)];
                pos_[size_t(r * L_ + slot)] = int32_t(p.input_pos + t);
                score_[size_t(r * L_ + slot)] = 0.0f;
                store_key(r, slot, f, r * p.n + t);
            }
        }
        T_ = p.length_after;
        P_ = p.input_pos + p.n;
        stash_window(f, p.n, std::min(window_, p.n), p.input_pos);
    }

    void update(const std::vector<float>&, int64_t) override { score_rows(false); }

    std::vector<float> slot_scores() const override {
        if (T_ < L_) return {};
        // The tokens a next chunk of one token may not evict (the w most recent after it) score
        // +inf, as a grace ring does; a longer chunk protects fewer.
        std::vector<float> out(score_);
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < L_; ++j)
                if (pos_[size_t(r * L_ + j)] >= P_ + 1 - window_) out[size_t(r * L_ + j)] = std::numeric_limits<float>::infinity();
        return out;
    }

    double preference() const { return pref_; }
    int64_t window() const { return window_; }

   private:
    int64_t rows() const { return B_ * G_; }

    void relayout(int64_t L) override {
        restride_rows(pos_, rows(), L_, L, int32_t(-1));
        restride_rows(score_, rows(), L_, L, 0.0f);
        restride_rows(keys_t_, rows() * D_, L_, L, 0.0f);  // (B*G, D, L): rows of L per (row, d)
        L_ = L;
    }

    // The key of new token i (features index) into slot `slot` of row r, stored transposed
    // (row r: D x L) so the window's logits are one product Q K^T.
    void store_key(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) {
        if (D_ == 0) {
            D_ = f.head_dim;
            keys_t_.assign(size_t(rows() * D_ * L_), 0.0f);
        }
        const float* k = f.keys.data() + i * D_;
        for (int64_t d = 0; d < D_; ++d) keys_t_[size_t((r * D_ + d) * L_ + slot)] = k[d];
    }

    // The last q queries of a chunk of n at input position P0 (B, NH, q, D), their positions
    // and the attention scale, for the next scoring.
    void stash_window(const InsertFeatures& f, int64_t n, int64_t q, int64_t P0) {
        NH_ = f.query_heads;
        scale_ = f.attn_scale;
        qw_ = q;
        q0_ = P0 + n - q;
        wq_.resize(size_t(B_ * NH_ * q * D_));
        for (int64_t bh = 0; bh < B_ * NH_; ++bh)
            std::copy_n(f.queries.begin() + (bh * n + n - q) * D_, q * D_, wq_.begin() + bh * q * D_);
    }

    // The window's softmax over every cached token, per row: the indicator of every slot, and at
    // the prefill the layer's preference (tokens before the window only).
    void score_rows(bool preference) {
        const int64_t T = T_, q = qw_, R = G_ > 0 ? NH_ / G_ : 0, half = kernel_ / 2;
        if (q == 0 || R == 0) {  // a one-token prefill has no window: nothing to say yet
            std::fill(score_.begin(), score_.end(), 0.0f);
            pref_ = 0;
            return;
        }
        // the thread's scratch, kept between calls and shared by the layers: a fresh array of
        // R q T doubles per call is fresh zeroed pages every time
        Scratch& sc = scratch();
        std::vector<float>& logits = sc.logits;
        std::vector<double>&a = sc.a, &xs = sc.xs, &u = sc.u, &s1 = sc.s1, &s2 = sc.s2, &mean = sc.mean;
        std::vector<int32_t>& order = sc.order;
        logits.resize(size_t(R * q * T)), a.resize(size_t(R * q * T));
        for (std::vector<double>* v : {&xs, &u, &s1, &s2, &mean}) v->resize(size_t(T));
        order.resize(size_t(T));
        double H = 0, V = 0;
        const int level = policy_matmul_level();  // the softmax and moments at the CPU's vector width (policy_cake_math.h)
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t b = r / G_, g = r % G_;
            const int32_t* pos = pos_.data() + r * L_;
            // (R q x D) . (D x T): the group's heads are consecutive, so are their window queries
            policy_matmul(R * q, T, D_, wq_.data() + (b * NH_ + g * R) * q * D_, D_, keys_t_.data() + r * D_ * L_, L_, logits.data(), T);
            cake_window_softmax(level, logits.data(), R * q, q, T, pos, q0_, scale_, xs.data(), a.data());
            cake_window_moments(level, a.data(), R, q, T, pos, q0_, gamma_, preference, s1.data(), s2.data(), mean.data(), u.data(), H, V);
            // average-pooled over neighbours in token-position order (zero padding counted)
            std::iota(order.begin(), order.end(), 0);
            std::sort(order.begin(), order.end(), [pos](int32_t x, int32_t y) { return pos[x] < pos[y]; });
            for (int64_t i = 0; i < T; ++i) {
                double s = 0;
                for (int64_t k = std::max<int64_t>(0, i - half); k <= std::min(T - 1, i + half); ++k) s += u[size_t(order[size_t(k)])];
                score_[size_t(r * L_ + order[size_t(i)])] = float(s / double(kernel_));
            }
        }
        if (preference) pref_ = std::pow(H, 1.0 / tau1_) * std::pow(V, 1.0 / tau2_);
    }

    std::vector<int64_t> decide(const std::vector<std::vector<double>>& says, const std::vector<int64_t>& floors,
                                int64_t total) const override {
        std::vector<double> pref;
        for (const std::vector<double>& v : says) pref.push_back(v.empty() ? 0.0 : v[0]);
        return cake_layer_budgets(pref, floors, total_ > 0 ? total_ : total, window_);
    }

    int64_t total_, window_, kernel_;
    double tau1_, tau2_, gamma_;
    std::vector<int32_t> pos_;     // (B*G, L) token position per slot, -1 empty
    std::vector<float> score_;     // (B*G, L) indicator (lower = evicted first)
    std::vector<float> keys_t_;    // (B*G, D, L) cached keys, transposed
    std::vector<float> wq_;        // (B, NH, qw, D) the last chunk's window queries
    int64_t D_ = 0, NH_ = 0, qw_ = 0, q0_ = 0;
    float scale_ = 1.0f;
    double pref_ = 0;
    struct Scratch {  // score_rows' arrays (every element written before it is read)
        std::vector<float> logits;                   // (R q, T)
        std::vector<double> a, xs, u, s1, s2, mean;  // weights (R q, T); per slot
        std::vector<int32_t> order;                  // slots in position order
    };
    static Scratch& scratch() {
        static thread_local Scratch s;
        return s;
    }
};

}  // namespace

double cake_preference(const KVPolicy& p) {
    const auto* c = dynamic_cast<const CakePolicy*>(&p);
    if (!c) throw Error(str("cake_preference: '", p.name(), "' is not a cake policy"));
    return c->preference();
}

int64_t cake_window(const KVPolicy& p) {
    const auto* c = dynamic_cast<const CakePolicy*>(&p);
    if (!c) throw Error(str("cake_window: '", p.name(), "' is not a cake policy"));
    return c->window();
}

std::vector<PolicyInfo> cake_policies() {
    return {{.name = "cake",
             .summary = "CAKE: layer budgets from attention entropy x variance at the prefill; evicts by mean + gamma var of the window's attention",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CakePolicy>(a.cfg, a.L, a.G); },
             // buffers that can change a layer's length (resize_slots)
             .buffers = {"default", "f32", "bf16", "f16"},
             .uses = {"snapkv_window", "snapkv_kernel"},
             .options = {{.name = "cake_tau1",
                          .help = "cake: temperature tau1 of the attention entropy in the layer preference H^(1/tau1) V^(1/tau2)",
                          .def = 1.0,
                          .lo = 0.01,
                          .hi = 100.0},
                         {.name = "cake_tau2",
                          .help = "cake: temperature tau2 of the attention variance in the layer preference H^(1/tau1) V^(1/tau2)",
                          .def = 1.0,
                          .lo = 0.01,
                          .hi = 100.0},
                         {.name = "cake_gamma",
                          .help = "cake: weight gamma of the variance in the eviction indicator mean + gamma var",
                          .def = 200.0,
                          .lo = 0.0,
                          .hi = 1e6},
                         {.name = "cake_floor_fraction",
                          .help = "cake: every layer keeps at least this fraction of cache_length of earlier tokens besides a "
                                  "chunk; it is also each layer's length (its prefill) until the budgets are decided",
                          .def = 0.25,
                          .lo = 0.01,
                          .hi = 1.0},
                         {.name = "cake_total_budget",
                          .help = "cake: slots over all layers shared out by preference (0: cache_length x layers)",
                          .def = 0,
                          .lo = 0,
                          .hi = 9007199254740992.0,
                          .integer = true}},
             .initial_layer_length = cake_initial_length,
             .doc_anchor = "docs/POLICIES.md#cake"}};
}

}  // namespace kv
