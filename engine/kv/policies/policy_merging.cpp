// merging-<scorer> (kvpress' MergingPress, a merge-on-evict wrapper): the wrapped scorer chooses
// the evicted slots; each evicted slot's value is folded into the kept slot of the same (b, KV
// head) row whose key is most similar (cosine), as a running average weighted by the tokens
// each slot already holds:
//   t = argmax over kept slots of cos(k_e, k_t)       (ties: the lower slot)
//   v_t <- (c_t v_t + c_e v_e) / (c_t + c_e),  c_t <- c_t + c_e      (c: tokens folded in, 1 at insertion)
// skipped when cos(k_e, k_t) < merging_threshold. Keys are never changed (RoPE stays intact).
// The merges ride on the plan (value_merge_policy.h), so replays apply the same map.
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/policies/nearest_key.h"
#include "engine/kv/policies/value_merge_policy.h"
#include "engine/kv/policies/wrapped_policy.h"

namespace kv {

std::vector<PolicyInfo> snapkv_policies();
std::vector<PolicyInfo> knorm_policies();

namespace {

class MergingPolicy final : public ValueMergePolicy {
   public:
    MergingPolicy(const PolicyArgs& a, const char* inner, const char* name)
        : ValueMergePolicy(a, inner, name, Feature::KeyVectors, false), threshold_(a.cfg.policy_option("merging_threshold")) {}

   protected:
    void plan_row_merges(int64_t r, const std::vector<int32_t>& evicted, const std::vector<int32_t>& kept, SlotPlan& p) const override {
        const int64_t D = head_dim();
        const int64_t nk = int64_t(kept.size()), ne = int64_t(evicted.size());
        to_.resize(size_t(ne));
        cos_.resize(size_t(ne));
        nearest_by_cosine(slot_keys().data() + r * L_ * D, D, evicted.data(), ne, kept.data(), nk, to_.data(), cos_.data(), nearest_);
        // Counts as the merges of this row leave them, in order (a target may take several).
        count_.assign(slot_counts().begin() + r * L_, slot_counts().begin() + (r + 1) * L_);
        for (int64_t j = 0; j < ne; ++j) {
            const int32_t e = evicted[size_t(j)];
            if (to_[size_t(j)] < 0 || cos_[size_t(j)] < threshold_) continue;
            const int32_t to = kept[size_t(to_[size_t(j)])];
            const double ct = count_[size_t(to)], ce = count_[size_t(e)];
            add_merge(p, r, to, e, ct / (ct + ce), ce / (ct + ce));
            count_[size_t(to)] = ct + ce;
        }
    }

   private:
    double threshold_;
    // scratch of plan_row_merges
    mutable std::vector<int32_t> to_;
    mutable std::vector<double> cos_, count_;
    mutable NearestKeyScratch nearest_;
};

PolicyInfo merging_of(const std::vector<PolicyInfo>& file, const char* inner, const char* name, const char* summary) {
    const PolicyInfo* in = &wrapped_policy(file, inner, name);
    return {.name = name,
            .summary = summary,
            .needs_attention_weights = in->needs_attention_weights,
            .merges_values = true,
            .buffers = {"default", "f32", "bf16", "f16"},
            .uses = in->uses,
            .doc_anchor = "docs/POLICIES.md#merging"};
}

}  // namespace

std::vector<PolicyInfo> merging_policies() {
    std::vector<PolicyInfo> out;
    out.push_back(merging_of(snapkv_policies(), "snapkv", "merging-snapkv",
                             "SnapKV's evictions, each evicted value averaged into the kept slot of most similar key (kvpress' MergingPress)"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<MergingPolicy>(a, "snapkv", "merging-snapkv"); };
    out.back().options = {{.name = "merging_threshold",
                           .help = "merging-*: an evicted value merges only when its key's cosine with the nearest kept key is at least this",
                           .def = 0.0, .lo = -1, .hi = 1}};
    out.push_back(merging_of(knorm_policies(), "knorm", "merging-knorm",
                             "Knorm's evictions, each evicted value averaged into the kept slot of most similar key"));
    out.back().make = [](const PolicyArgs& a) -> std::unique_ptr<KVPolicy> { return std::make_unique<MergingPolicy>(a, "knorm", "merging-knorm"); };
    return out;
}

}  // namespace kv
