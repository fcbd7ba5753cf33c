// critical-<scorer> (CriticalKV, Feng et al. 2025, "Identify Critical KV Cache in LLM Inference
// from an Output Perturbation Perspective"; as kvpress' CriticalKVPress): a scorer's scores are
// rescaled by how much a slot's value can move the layer's output, with a two-stage selection.
// With s_j the wrapped scorer's score of slot j (its eviction score) and v_j its value,
//   stage 1: the k1 = floor(critical_first_stage * L) candidates of highest s_j are kept
//            outright (score FLT_MAX; ties: the higher slot first, the mirror of eviction's rule)
//   stage 2: every other candidate scores (s_j + critical_epsilon) * n_j,
//            n_j = (1/R) sum over the R query heads h of the slot's KV head of ||W_o,h v_j||_1
// W_o,h: the columns [h D, (h+1) D) of the layer's output projection [E, NH D] (kvpress' vwl1norm).
// The cache length L is kvpress' budget (1 - compression_ratio) * k_len: what a layer keeps.
// W_o reaches the policy through the output-projection plumbing (output_projection.h); a layer
// driven without a model gets none and uses W_o = I (n_j = ||v_j||_1). The wrapped scorer runs
// beside this policy on the same plans (same slots, same grace ring), so any per-slot scorer fits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/core/cache_name.h"
#include "engine/core/error.h"
#include "engine/kv/policies/output_projection.h"
#include "engine/kv/policies/projected_l1.h"
#include "engine/kv/policies/policy_score_based.h"
#include "engine/kv/policies/wrapped_policy.h"
#include "engine/model/packed_weight.h"

namespace kv {

std::vector<PolicyInfo> snapkv_policies();
std::vector<PolicyInfo> expected_attention_policies();

namespace {
class CriticalPolicy final : public ScorePolicy, public OutputProjectionUser, public TwoStageScores {
   public:
    CriticalPolicy(const PolicyArgs& a, const std::string& inner_name, const char* name)
        : ScorePolicy(a.cfg, a.L, a.G),
          name_(name),
          first_stage_(a.cfg.policy_option("critical_first_stage")),
          eps_(a.cfg.policy_option("critical_epsilon")) {
        KVCacheConfig c = a.cfg;
        c.name = CacheName{inner_name, a.cfg.buffer()}.text();
        // kvpress warns that expected attention's value norm must be off under CriticalKV: the
        // projected norm replaces it.
        if (find_policy_option("ea_use_vnorm")) c.policy_options["ea_use_vnorm"] = 0;
        std::unique_ptr<KVPolicy> p = find_policy(inner_name)->make(PolicyArgs{c, a.L, a.G, a.layer, a.text});
        inner_.reset(dynamic_cast<ScorePolicy*>(p.get()));
        if (!inner_) throw Error(str(name_, ": '", inner_name, "' is not a score policy"));
        (void)p.release();
    }
    const char* name() const override { return name_; }
    bool needs_attention_weights() const override { return inner_->needs_attention_weights(); }
    int64_t weights_query_window() const override { return inner_->weights_query_window(); }
    FeatureSet needs_features() const override { return inner_->needs_features() | Feature::ValueVectors; }

    void set_output_projection(const Tensor& wo) override {
        if (!wo.defined() || wo.data_ptr() == wo_key_) return;
        const Shape s = weight_shape(wo);
        if (s.ndim != 2) throw Error(str(name_, ": the output projection must be a matrix [E, NH * D]; it is ", wo.describe()));
        const std::vector<float> w = is_packed(wo) ? packed_to_f32(wo).to_f32_vector() : wo.to_f32_vector();
        E_ = s[0], Q_ = s[1];
        wo_ = w;  // [E, NH D] as the model holds it: W_o,h is columns [h D, h D + D) at row stride NH D
        wo_key_ = wo.data_ptr();
    }

    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        inner_->reset(batch);
        norm_.assign(size_t(rows() * L_), 0.0f);
        staged_.clear();
    }
    void prefill(int64_t n, const InsertFeatures& f) override {
        Own own(this);
        inner_->prefill(n, f);
        ScorePolicy::prefill(n, f);
        flush(f);
    }
    void apply(const SlotPlan& plan, const InsertFeatures& f) override {
        Own own(this);
        inner_->apply(plan, f);
        ScorePolicy::apply(plan, f);
        flush(f);
    }
    void update(const std::vector<float>& w, int64_t n) override {
        Own own(this);
        inner_->update(w, n);
        ScorePolicy::update(w, n);
    }

    // ---- TwoStageScores (critical-ada) -------------------------------------------------
    std::vector<float> allocation_scores() const override { return inner_->slot_scores(); }
    std::vector<float> selection_scores() const override {
        const std::vector<float> s = inner_->slot_scores();
        std::vector<float> out(s.size());
        for (size_t i = 0; i < s.size(); ++i) out[i] = float((double(s[i]) + eps_) * double(norm_[i]));
        return out;
    }
    double first_stage_fraction() const override { return first_stage_; }

   protected:
    // Within this policy's own prefill / apply / update the wrapped scorer runs its own calls;
    // driven through the hooks alone (by ada-*), they are handed on to it here.
    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override {
        if (!own_call_) wrapped_init_slot(*inner_, r, slot, f, i);
        staged_.push_back({r, slot, i});  // the norms of a chunk's values are taken together (flush)
    }
    void move_slot(int64_t r, int64_t from, int64_t to) override {
        if (!own_call_) wrapped_move_slot(*inner_, r, from, to);
        norm_[size_t(r * L_ + to)] = norm_[size_t(r * L_ + from)];
    }
    void accumulate(const std::vector<float>& w, int64_t n) override {
        if (own_call_) return;  // the wrapped scorer accumulated in its own update
        mirror_state(*inner_, *this);
        wrapped_accumulate(*inner_, w, n);
    }
    void observe_chunk(const InsertFeatures& f, int64_t input_pos, int64_t n) override {
        mirror_state(*inner_, *this);
        wrapped_observe_chunk(*inner_, f, input_pos, n);
        flush(f);
    }
    void eviction_scores(std::vector<float>& S) const override {
        const int64_t cand = L_ - grace();
        const std::vector<float> inner = inner_->slot_scores();  // (rows, L); the ring's +inf never read
        const int64_t k1 = std::min<int64_t>(cand, int64_t(first_stage_ * double(L_)));
        order_.resize(size_t(cand));
        for (int64_t r = 0; r < rows(); ++r) {
            const float* s = inner.data() + r * L_;
            float* out = S.data() + r * cand;
            for (int64_t j = 0; j < cand; ++j) out[j] = float((double(s[j]) + eps_) * double(norm_[size_t(r * L_ + j)]));
            if (k1 == 0) continue;
            std::iota(order_.begin(), order_.end(), 0);
            // The comparison is a strict total order, so the k1 first are one set however they
            // are ordered: a selection, not a sort.
            std::nth_element(order_.begin(), order_.begin() + (k1 - 1), order_.end(),
                             [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a > b); });
            for (int64_t t = 0; t < k1; ++t) out[order_[size_t(t)]] = std::numeric_limits<float>::max();
        }
    }

   private:
    struct Staged {
        int64_t r, slot, i;
    };
    // n_j of the slots written by this call: (1/R) sum_h ||W_o,h v||_1 over the R query heads of
    // the KV head, ||v||_1 without W_o. A head's new values (transposed, D x mp, zero columns up
    // to a multiple of 16) go through each W_o,h together (projected_l1.h: the product's tiles
    // summed as they are made, never stored).
    void flush(const InsertFeatures& f) {
        const int64_t D = f.head_dim;
        if (wo_.empty()) {
            for (const Staged& s : staged_) {
                double a = 0;
                for (int64_t d = 0; d < D; ++d) a += std::fabs(double(f.values[size_t(s.i * D + d)]));
                norm_[size_t(s.r * L_ + s.slot)] = float(a);
            }
            staged_.clear();
            return;
        }
        if (Q_ % D != 0 || (Q_ / D) % G_ != 0)
            throw Error(str(name_, ": the output projection has ", Q_, " input columns; expected a multiple of ", D, " (head size) x ",
                            G_, " (KV heads)"));
        const int64_t R = Q_ / D / G_;
        for (int64_t g = 0; g < G_; ++g) {
            int64_t m = 0;
            for (const Staged& s : staged_) m += s.r % G_ == g;
            if (m == 0) continue;
            const int64_t mp = (m + 15) / 16 * 16;
            vals_.assign(size_t(D * mp), 0.0f);
            int64_t t = 0;
            for (const Staged& s : staged_)
                if (s.r % G_ == g) {
                    for (int64_t d = 0; d < D; ++d) vals_[size_t(d * mp + t)] = f.values[size_t(s.i * D + d)];
                    ++t;
                }
            sum_.assign(size_t(mp), 0.0);
            for (int64_t h = g * R; h < (g + 1) * R; ++h) projected_l1_norms(E_, mp, D, wo_.data() + h * D, Q_, vals_.data(), mp, sum_.data());
            t = 0;
            for (const Staged& s : staged_)
                if (s.r % G_ == g) norm_[size_t(s.r * L_ + s.slot)] = float(sum_[size_t(t++)] / double(R));
        }
        staged_.clear();
    }

    struct Own {  // marks this policy's own prefill / apply / update
        explicit Own(CriticalPolicy* p) : p_(p) { p_->own_call_ = true; }
        ~Own() { p_->own_call_ = false; }
        CriticalPolicy* p_;
    };
    bool own_call_ = false;
    const char* name_;
    double first_stage_, eps_;
    std::unique_ptr<ScorePolicy> inner_;
    std::vector<float> norm_;  // (B*G, L) n_j of each slot
    std::vector<float> wo_;    // W_o [E, NH D]; empty: W_o = I
    int64_t E_ = 0, Q_ = 0;
    const void* wo_key_ = nullptr;
    std::vector<Staged> staged_;           // slots written by this call, their values' norms pending
    std::vector<float> vals_;              // scratch: one KV head's new values (D x mp)
    std::vector<double> sum_;              // scratch: their norms summed over the heads
    mutable std::vector<int32_t> order_;   // scratch: a row's candidates by the wrapped score
};

// The descriptor of critical-<inner> from the inner scorer's: the same needs and shared options.
PolicyInfo critical_of(const std::vector<PolicyInfo>& file, const char* inner, const char* name, const char* summary) {
    const PolicyInfo* in = &wrapped_policy(file, inner, name);
    return {.name = name,
            .summary = summary,
            .make = nullptr,
            .needs_attention_weights = in->needs_attention_weights,
            .uses = in->uses,
            .doc_anchor = "docs/POLICIES.md#critical"};
}
}  // namespace

std::vector<PolicyInfo> critical_policies() {
    std::vector<PolicyInfo> out;
    out.push_back(critical_of(snapkv_policies(), "snapkv", "critical-snapkv",
                              "CriticalKV over SnapKV: half the budget by SnapKV, the rest by SnapKV x ||W_o v||_1 (kvpress' criticalkv)"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CriticalPolicy>(a, "snapkv", "critical-snapkv"); };
    out.back().options = {
        {.name = "critical_first_stage", .help = "critical-*: fraction of the cache length kept by the wrapped score alone (stage 1)", .def = 0.5, .lo = 0, .hi = 1},
        {.name = "critical_epsilon", .help = "critical-*: stage 2 scores (score + epsilon) x ||W_o v||_1", .def = 1e-4, .lo = 0, .hi = 1e6}};
    out.push_back(critical_of(expected_attention_policies(), "expected-attention", "critical-expected-attention",
                              "CriticalKV over Expected Attention (its value norm off): stage 2 by expected attention x ||W_o v||_1"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> {
        return std::make_unique<CriticalPolicy>(a, "expected-attention", "critical-expected-attention");
    };
    return out;
}

}  // namespace kv
