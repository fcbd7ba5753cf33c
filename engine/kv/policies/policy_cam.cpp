// cam-<scorer> (CaM, Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference",
// ICML 2024; kvpress' CAMPress): the wrapped scorer chooses the evicted slots; each evicted
// slot e's value is spread over the m kept slots that follow it in sequence order (its merge
// window W_e, m = min(cam_merge_budget, kept slots after it) in its (b, KV head) row), with
// the merge probability of CaM taken as its expected value instead of a Bernoulli draw:
//   p_e = clamp(A_e / mean over t in W_e of A_t, 0, 1)      (0/0 -> 0, x/0 -> 1, as the press)
//   v_t <- v_t + (p_e / m) v_e   for every t in W_e
// A_j: the attention-weight sums slot j received, accumulated over every chunk since its token
// entered (the press's cumulative attention). Keys are never changed; the merges ride on the
// plan (value_merge_policy.h), so replays apply the same map.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/policies/value_merge_policy.h"
#include "engine/kv/policies/wrapped_policy.h"

namespace kv {

std::vector<PolicyInfo> h2o_policies();
std::vector<PolicyInfo> knorm_policies();

namespace {

class CamPolicy final : public ValueMergePolicy {
   public:
    CamPolicy(const PolicyArgs& a, const char* inner, const char* name)
        : ValueMergePolicy(a, inner, name, {}, true), budget_(int64_t(a.cfg.policy_option("cam_merge_budget"))) {}

   protected:
    void plan_row_merges(int64_t r, const std::vector<int32_t>& evicted, const std::vector<int32_t>& kept, SlotPlan& p) const override {
        const int32_t* pos = pos_.data() + r * L_;
        const double* A = slot_attention().data() + r * L_;
        // Kept slots in sequence order: (position, slot) packed in one key sorts without
        // indirection (positions are unique and non-negative in a row).
        keyed_.resize(kept.size());
        for (size_t i = 0; i < kept.size(); ++i) keyed_[i] = uint64_t(uint32_t(pos[kept[i]])) << 32 | uint32_t(kept[i]);
        std::sort(keyed_.begin(), keyed_.end());
        order_.resize(kept.size());
        for (size_t i = 0; i < kept.size(); ++i) order_[i] = int32_t(keyed_[i] & 0xffffffffu);
        for (int32_t e : evicted) {
            const auto first = order_.begin() + (std::upper_bound(keyed_.begin(), keyed_.end(), uint64_t(uint32_t(pos[e])) << 32 | 0xffffffffu) - keyed_.begin());
            const int64_t m = std::min<int64_t>(budget_, order_.end() - first);
            if (m == 0) continue;
            double mean = 0;
            for (int64_t i = 0; i < m; ++i) mean += A[first[i]];
            mean /= double(m);
            double prob = mean > 0 ? A[e] / mean : (A[e] > 0 ? 1.0 : 0.0);
            prob = std::clamp(prob, 0.0, 1.0);
            if (prob == 0) continue;
            for (int64_t i = 0; i < m; ++i) add_merge(p, r, first[i], e, 1.0, prob / double(m));
        }
    }

   private:
    int64_t budget_;
    mutable std::vector<int32_t> order_;  // scratch of plan_row_merges
    mutable std::vector<uint64_t> keyed_;
};

PolicyInfo cam_of(const std::vector<PolicyInfo>& file, const char* inner, const char* name, const char* summary) {
    const PolicyInfo* in = &wrapped_policy(file, inner, name);
    return {.name = name,
            .summary = summary,
            .needs_attention_weights = true,
            .merges_values = true,
            .buffers = {"default", "f32", "bf16", "f16"},
            .uses = in->uses,
            .doc_anchor = "docs/POLICIES.md#cam"};
}

}  // namespace

std::vector<PolicyInfo> cam_policies() {
    std::vector<PolicyInfo> out;
    out.push_back(cam_of(h2o_policies(), "h2o", "cam-h2o",
                         "CaM over H2O: each evicted value spread over the kept slots after it, weighted by its attention share (kvpress' CAMPress)"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CamPolicy>(a, "h2o", "cam-h2o"); };
    out.back().options = {{.name = "cam_merge_budget",
                           .help = "cam-*: kept slots after an evicted token that share its value (CaM's merge window)",
                           .def = 32, .lo = 1, .hi = 1 << 20, .integer = true}};
    out.push_back(cam_of(knorm_policies(), "knorm", "cam-knorm",
                         "CaM over Knorm: Knorm's evictions, each value spread over the kept slots after it by its attention share"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<CamPolicy>(a, "knorm", "cam-knorm"); };
    return out;
}

}  // namespace kv
