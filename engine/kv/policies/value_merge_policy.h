// The wrapper shared by merging-<scorer> and cam-<scorer>: a score policy that lets a wrapped
// scorer choose the evicted slots (the scorer runs beside it on the same plans, as critical-*
// does) and, instead of dropping an evicted slot's value, folds it into kept slots. The fold is
// a list of value merges carried by the plan (SlotPlan::merge_*), so the buffer, the replay log,
// a replayed cache and the gradient replay all apply the same linear map; keys never change, so
// every kept key keeps its own token's RoPE rotation. A subclass says where a value goes
// (plan_row_merges); this class finds the evicted and kept slots of each row of a plan and keeps
// the per-slot state the rules read (keys, token counts, accumulated attention).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/kv/policies/policy_score_based.h"

namespace kv {

class ValueMergePolicy : public ScorePolicy {
   public:
    // own_features: what the merge rule reads beyond the wrapped scorer's needs; own_weights:
    // the rule reads the attention-weight sums (cam).
    ValueMergePolicy(const PolicyArgs& a, const std::string& inner_name, std::string name, FeatureSet own_features, bool own_weights);

    const char* name() const override { return name_.c_str(); }
    bool needs_attention_weights() const override { return own_weights_ || inner_->needs_attention_weights(); }
    int64_t weights_query_window() const override { return inner_->weights_query_window(); }
    FeatureSet needs_features() const override { return inner_->needs_features() | own_features_; }

    void reset(int64_t batch) override;
    void prefill(int64_t n, const InsertFeatures& f) override;
    SlotPlan prepare(int64_t n) const override;
    void apply(const SlotPlan& plan, const InsertFeatures& f) override;
    void update(const std::vector<float>& w, int64_t n) override;

    // Per-slot state the rules read, (rows, L) row-major (keys (rows, L, D)).
    const std::vector<float>& slot_keys() const { return keys_; }
    const std::vector<double>& slot_counts() const { return count_; }
    const std::vector<double>& slot_attention() const { return attn_; }

   protected:
    // One row of a plan: `evicted` are the slots whose token leaves (ascending), `kept` those
    // whose token stays in place (ascending; new tokens and grace-ring moves excluded). Append
    // the row's merges to p (SlotPlan::merge_*), in the order they apply.
    virtual void plan_row_merges(int64_t r, const std::vector<int32_t>& evicted, const std::vector<int32_t>& kept, SlotPlan& p) const = 0;

    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) override;
    void move_slot(int64_t r, int64_t from, int64_t to) override;
    void accumulate(const std::vector<float>& w, int64_t n) override;
    void eviction_scores(std::vector<float>& S) const override;

    int64_t head_dim() const { return D_; }
    static void add_merge(SlotPlan& p, int64_t r, int32_t to, int32_t from, double keep, double take);

   private:
    std::string name_;
    FeatureSet own_features_;
    bool own_weights_;
    std::unique_ptr<ScorePolicy> inner_;
    int64_t D_ = 0;
    std::vector<float> keys_;     // (rows, L, D) each slot's key as the buffer was given it (KeyVectors)
    std::vector<double> count_;   // (rows, L) tokens folded into each slot, its own included (a merge adds the source's)
    std::vector<double> attn_;    // (rows, L) attention-weight sums received, over every chunk
};

}  // namespace kv
