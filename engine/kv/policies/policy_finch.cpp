// finch (FINCH, Corallo & Papotti 2024, "FINCH: Prompt-guided Key-Value Cache Compression for
// Large Language Models"; as kvpress' FinchPress): the prompt's last queries say which context
// tokens matter, the document is read in chunks and the cache compressed after each. After every
// chunk ending at P, with the chunk's last N = min(snapkv_window, n) queries at positions
// p_i = P - N + i and a_{h,i,j} their softmax over the cached slots (causal, scaled, as the layer
// attends), each slot j at a position before the window scores
//   s_j = mean over the group's query heads h and the N queries of  p_i a_{h,i,j}
// (kvpress' normalize_scores: a query over p_i + 1 keys has weights ~1/p_i; finch_normalize 0
// drops the factor), and the window's tokens take the layer's largest score + 1 (kept). No
// pooling (unlike SnapKV). The weights are recomputed here from the chunk's queries and the
// cached keys, because the factor is per query and the layer's weight sums are not.
// Keys are kept per slot, transposed (+4 D bytes per slot and row); the logits are one f64 product per row
// (finch_logits, the keys widened exactly) and the exponentials policy_exp_sum_f32's (f32, summed in f64).
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/kv/policies/policy_finch_math.h"
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_score_based.h"

namespace kv {

namespace {
class FinchPolicy final : public ScorePolicy {
   public:
    FinchPolicy(const KVCacheConfig& cfg, int64_t L, int64_t G)
        : ScorePolicy(cfg, L, G), window_(cfg.snapkv_window), normalize_(cfg.policy_option("finch_normalize") != 0) {}
    const char* name() const override { return "finch"; }
    FeatureSet needs_features() const override { return {Feature::KeyVectors, Feature::QueryVectors}; }
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
        keyt_.clear(), q_.clear();
        D_ = NH_ = nq_ = 0;
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
            keyt_.assign(size_t(rows() * D_ * L_), 0.0f);
        }
        score_[size_t(r * L_ + slot)] = 0.0f;
        float* kt = keyt_.data() + r * D_ * L_ + slot;
        for (int64_t x = 0; x < D_; ++x) kt[x * L_] = f.keys[size_t(i * D_ + x)];
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        score_[size_t(r * L_ + to)] = score_[size_t(r * L_ + from)];
        float* kt = keyt_.data() + r * D_ * L_;
        for (int64_t x = 0; x < D_; ++x) kt[x * L_ + to] = kt[x * L_ + from];
    }
    // The chunk's last N queries (rotated, as the layer attends with them) and the scale.
    void observe_chunk(const InsertFeatures& f, int64_t input_pos, int64_t n) override {
        (void)input_pos;
        if (f.queries.empty()) return;
        NH_ = f.query_heads;
        scale_ = f.attn_scale;
        nq_ = std::min(window_, n);
        q_.resize(size_t(B_ * NH_ * nq_ * D_));
        for (int64_t b = 0; b < B_; ++b)
            for (int64_t h = 0; h < NH_; ++h)
                std::copy_n(f.queries.begin() + ((b * NH_ + h) * n + n - nq_) * D_, nq_ * D_, q_.begin() + ((b * NH_ + h) * nq_) * D_);
    }
    void accumulate(const std::vector<float>&, int64_t) override {
        // every score is recomputed here and read only from a full cache (choose_next, slot_scores)
        if (nq_ == 0 || T_ < L_) return;
        const int64_t T = T_, R = NH_ / G_, M = R * nq_, first = P_ - nq_;
        double top = -std::numeric_limits<double>::infinity();
        const int level = policy_matmul_level();
        acc_.resize(size_t(T)), e_.resize(size_t(T));
        qd_.resize(size_t(M * D_)), logit_.resize(size_t(M * T)), pre_.resize(size_t(T));
        for (int64_t r = 0; r < rows(); ++r) {
            const int64_t b = r / G_, g = r % G_;
            const int32_t* pos = pos_.data() + r * L_;
            // The group's window queries (M x D) against the row's keys (D x T): one product.
            for (int64_t m = 0; m < M; ++m)
                for (int64_t x = 0; x < D_; ++x) qd_[size_t(m * D_ + x)] = double(q_[size_t(((b * NH_ + g * R) * nq_ + m) * D_ + x)]);
            finch_logits(M, T, D_, qd_.data(), keyt_.data() + r * D_ * L_, L_, double(scale_), logit_.data());
            std::fill(acc_.begin(), acc_.end(), 0.0);
            // the slots a window query may not see (empty, or at the window's positions: at most
            // N) are listed once; pre_: 1 for the slots before the window (scored), else 0
            late_.clear();
            for (int64_t j = 0; j < T; ++j) {
                if (pos[j] < 0 || pos[j] >= first) late_.push_back(j);
                pre_[size_t(j)] = pos[j] >= 0 && pos[j] < first ? 1.0 : 0.0;
            }
            // the window's softmaxes at the CPU's vector width (policy_finch_math.h)
            finch_window_scores(level, logit_.data(), M, nq_, T, pos, first, late_.data(), int64_t(late_.size()), normalize_, pre_.data(),
                                e_.data(), acc_.data());
            for (int64_t j = 0; j < T; ++j)
                if (pos[j] >= 0 && pos[j] < first) {
                    score_[size_t(r * L_ + j)] = float(acc_[size_t(j)]);
                    top = std::max(top, acc_[size_t(j)]);
                }
        }
        if (top == -std::numeric_limits<double>::infinity()) top = 0;
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < T; ++j)
                if (pos_[size_t(r * L_ + j)] >= first) score_[size_t(r * L_ + j)] = float(top + 1);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    int64_t window_;
    bool normalize_;
    int64_t D_ = 0, NH_ = 0, nq_ = 0;
    float scale_ = 0.0f;
    std::vector<float> score_;  // (B*G, L)
    std::vector<float> keyt_;   // (B*G, D, L) the cached keys as the buffer was given them, transposed (the product's operand)
    std::vector<float> q_;      // (B, NH, N, D) the last chunk's window queries
    std::vector<double> acc_, e_, qd_, logit_, pre_;  // scratch for one row
    std::vector<int64_t> late_;
};
}  // namespace

std::vector<PolicyInfo> finch_policies() {
    return {{.name = "finch",
             .summary = "FINCH: the chunk's last snapkv_window queries score the context, weights times the query's position (normalised), no pooling",
             .make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<FinchPolicy>(a.cfg, a.L, a.G); },
             .uses = {"snapkv_window", "grace_period", "keep_initial_fraction", "max_chunk_size"},
             .options = {{.name = "finch_normalize",
                          .help = "finch: 1 multiplies each window query's weights by its position (kvpress' normalize_scores), 0 does not",
                          .def = 1,
                          .lo = 0,
                          .hi = 1,
                          .integer = true}},
             .doc_anchor = "docs/POLICIES.md#finch"}};
}

}  // namespace kv
