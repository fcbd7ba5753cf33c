// The eviction machinery shared by every score-based policy (keys_values' AttnWeightsKVCache,
// reference §4.4): per-(b, g) token positions, the grace ring of the most recent tokens, the
// one-time keep-initial rule after a full prefill, and next slots = the lowest scores, ties
// broken by the lower slot index (deterministic; equals keys_values' sorted debug mode), via
// top-k when max_chunk_size is set. A policy on top of it is a scorer: it decides what a
// slot's score is (policy_h2o.cpp, policy_qh2o.cpp, policy_tova.cpp, ...).
#pragma once

#include "engine/kv/kv_policy.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

class ScorePolicy : public KVPolicy {
   public:
    ScorePolicy(const KVCacheConfig& cfg, int64_t L, int64_t G);

    // ---- planning (KVPolicy) -----------------------------------------------------------
    void reset(int64_t batch) override;
    int64_t max_forward_length() const override;
    void prefill(int64_t n, const InsertFeatures& f) override;
    SlotPlan prepare(int64_t n) const override;
    void apply(const SlotPlan& plan, const InsertFeatures& f) override;
    void update(const std::vector<float>& w, int64_t n) override;

    bool per_row_positions() const override { return true; }
    const std::vector<int32_t>& token_positions() const override { return pos_; }
    std::vector<float> slot_scores() const override;

    int64_t grace() const { return grace_; }
    int64_t max_chunk() const { return max_chunk_; }

   protected:
    friend class AdaKVPolicy;  // drives a scorer's hooks over a per-layer slot pool (policy_ada.cpp)
    friend class LukvPolicy;   // the same over a pool of per-head budgets from a table (policy_lukv.cpp)
    // ---- scorer hooks ------------------------------------------------------------------
    // Set score state for slot `slot` of row r that now holds new token t (features index r*n+t).
    virtual void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t feat_index) = 0;
    // Move score state from one slot to another within row r (grace ring).
    virtual void move_slot(int64_t r, int64_t from, int64_t to) = 0;
    // Fold this chunk's weight sums (possibly empty) into the score state.
    virtual void accumulate(const std::vector<float>& w, int64_t n) = 0;
    // Eviction score of slots [0, L - grace) for every row into S (rows * (L - grace)).
    virtual void eviction_scores(std::vector<float>& S) const = 0;
    // State a scorer keeps beyond its slots (expected-attention: the query statistics), fed
    // with every chunk after its tokens are placed. A scorer calls it from its own prefill() /
    // apply(); ada-* bypasses those and calls it directly (else that state never fills).
    virtual void observe_chunk(const InsertFeatures& f, int64_t input_pos, int64_t n) { (void)f, (void)input_pos, (void)n; }

    int64_t rows() const { return B_ * G_; }
    // Set by ada-*, which chooses the victims over its pool itself: a scorer
    // that picks its next victims as a side effect of scoring (kvzip's reconstruction hook)
    // then only scores.
    bool driven_by_pool_ = false;

    // ---- a scorer wrapping another over the same slots (critical-*) ---------------------
    // ada-* drives its scorer through the hooks above, never through prefill / apply /
    // update; a wrapper so driven hands them on to the scorer it wraps, whose slot state
    // (positions, lengths) first mirrors its own.
    static void wrapped_init_slot(ScorePolicy& p, int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) { p.init_slot(r, slot, f, i); }
    static void wrapped_move_slot(ScorePolicy& p, int64_t r, int64_t from, int64_t to) { p.move_slot(r, from, to); }
    static void wrapped_accumulate(ScorePolicy& p, const std::vector<float>& w, int64_t n) { p.accumulate(w, n); }
    static void wrapped_observe_chunk(ScorePolicy& p, const InsertFeatures& f, int64_t P0, int64_t n) { p.observe_chunk(f, P0, n); }
    static void mirror_state(ScorePolicy& to, const ScorePolicy& from) {
        to.pos_ = from.pos_;
        to.B_ = from.B_, to.T_ = from.T_, to.P_ = from.P_;
        to.prefill_length_ = from.prefill_length_;
    }

    std::vector<int32_t> pos_;  // (B*G, L) token position per slot, -1 empty
    int64_t prefill_length_ = 0;

   private:
    void choose_next();
    int64_t grace_;
    double keep_initial_fraction_;
    int64_t max_chunk_;                // 0 = full argsort
    int64_t next_grace_pos_ = 0;
    bool use_initial_rule_ = false;
    std::vector<int32_t> next_;        // (B*G, k) next slots, best candidates first
    int64_t next_k_ = 0;
};

// A scorer whose budget over a layer's heads and choice within a head use different scores
// (critical-*: the wrapped scorer's scores allocate, the output-rescaled ones choose, after the
// first stage's share of each head's budget is kept by the wrapped scores). ada-* asks for it
// (critical-ada); a scorer without it allocates and chooses by its eviction scores.
class TwoStageScores {
   public:
    virtual ~TwoStageScores() = default;
    // (rows, L): the wrapped scorer's score of every slot (budgets and the first stage).
    virtual std::vector<float> allocation_scores() const = 0;
    // (rows, L): the second stage's score of every slot.
    virtual std::vector<float> selection_scores() const = 0;
    // Share of a head's kept slots chosen by allocation_scores alone.
    virtual double first_stage_fraction() const = 0;
};

// A scorer whose whole state is one float per slot (tova, snapkv, knorm, random, ...): a score
// is set when a token enters (initial_score), moves with its token through the grace ring, and
// is the eviction score. A subclass says only how scores start (initial_score) and change
// (accumulate, writing score(r, j)).
class SlotScorePolicy : public ScorePolicy {
   public:
    using ScorePolicy::ScorePolicy;
    void reset(int64_t batch) override {
        ScorePolicy::reset(batch);
        score_.assign(size_t(rows() * L_), 0.0f);
    }

   protected:
    // Score of a new token (features index i); 0 unless the policy scores at insertion.
    virtual float initial_score(const InsertFeatures& f, int64_t i) const { (void)f, (void)i; return 0.0f; }
    void accumulate(const std::vector<float>& w, int64_t n) override { (void)w, (void)n; }
    float& score(int64_t r, int64_t slot) { return score_[size_t(r * L_ + slot)]; }

    void init_slot(int64_t r, int64_t slot, const InsertFeatures& f, int64_t i) final { score(r, slot) = initial_score(f, i); }
    void move_slot(int64_t r, int64_t from, int64_t to) final { score(r, to) = score(r, from); }
    void eviction_scores(std::vector<float>& S) const final {
        const int64_t cand = L_ - grace();
        for (int64_t r = 0; r < rows(); ++r)
            for (int64_t j = 0; j < cand; ++j) S[size_t(r * cand + j)] = score_[size_t(r * L_ + j)];
    }

   private:
    std::vector<float> score_;  // (B*G, L)
};

}  // namespace kv
