// The interface every cache policy implements (one policy per file: policy_<name>.cpp).
// A policy owns slot metadata only — token positions and scores — never K/V storage.
// Each chunk is a transaction: prepare() plans where the n new tokens go (and which old
// tokens move, for the grace ring) without mutating anything; apply() commits the plan;
// update() consumes the attention-weight sums of the chunk (score-based policies).
//
// Index
//   [SECTION] plans
//   [SECTION] policy interface (planning / state / telemetry hooks)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/telemetry/replay_plan.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/policy_capabilities.h"
#include "engine/kv/policy_features.h"

namespace kv {

class Tensor;
struct PolicyInfo;
struct PolicyArgs;

// =========================================================================================
// [SECTION] plans
// =========================================================================================
// SlotPlan (where one chunk of n new tokens goes) is the replay log's record type:
// engine/telemetry/replay_plan.h.

// What the buffer computed about the new tokens, for policies whose scores need it
// (h2o-vlen: value norms; knorm: key norms; qh2o: quantization errors). Row-major (B, G, n).
struct InsertFeatures {
    std::vector<float> value_norm;
    std::vector<float> key_norm;
    std::vector<float> quant_error;  // |k - deq(q(k))| + |v - deq(q(v))|
    std::vector<float> keys;         // (B, G, n, D) the new keys themselves (rkv: redundancy)
    std::vector<float> values;       // (B, G, n, D) the new values (policies written in Python may read them)
    int64_t head_dim = 0;            // D, set with keys
    // expected-attention: the chunk's rotated queries (B, NH, n, D), the RoPE frequencies
    // theta'_d that rotated them (null: unrotated; n_rot = 2 * size) and the attention scale.
    std::vector<float> queries;
    int64_t query_heads = 0;
    const std::vector<double>* rope_inv_freq = nullptr;
    float attn_scale = 0.0f;
    // kvzap: the hidden states the layer's q/k/v projections read (B, n, E), after the attention
    // norm (LayerAttention::set_layer_input).
    std::vector<float> hidden;
    int64_t hidden_size = 0;
};

// =========================================================================================
// [SECTION] policy interface
// =========================================================================================
class KVPolicy {
   public:
    virtual ~KVPolicy() = default;

    // ---- identity and needs -----------------------------------------------------------
    virtual const char* name() const = 0;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // What LayerCache computes for the policy (the rest of the engine never asks).
    virtual bool needs_attention_weights() const { return false; }
    // Queries of a chunk whose weights the policy wants: 0 = all (snapkv: the last window).
    virtual int64_t weights_query_window() const { return 0; }
    // The InsertFeatures the policy reads.
    virtual FeatureSet needs_features() const { return {}; }
    // ---- end of capabilities ----

    // ---- planning ----------------------------------------------------------------------
    // Start a new sequence with batch size B.
    virtual void reset(int64_t batch) = 0;
    // Longest chunk the next call may have (after prefill).
    virtual int64_t max_forward_length() const = 0;
    // The first call of a sequence: n <= L tokens into slots [0, n).
    virtual void prefill(int64_t n, const InsertFeatures& f) = 0;
    // Plan the next chunk; throws kv::Error when n is not allowed. Never mutates.
    virtual SlotPlan prepare(int64_t n) const = 0;
    // Commit a plan produced by prepare() (or replayed from a log).
    virtual void apply(const SlotPlan& plan, const InsertFeatures& f) = 0;
    // Attention-weight sums of the chunk just attended: w (B, G, T) row-major, n queries.
    virtual void update(const std::vector<float>& w, int64_t n) { (void)w, (void)n; }

    // ---- state -------------------------------------------------------------------------
    int64_t cache_length() const { return L_; }
    int64_t batch() const { return B_; }
    int64_t groups() const { return G_; }
    int64_t current_length() const { return T_; }
    int64_t input_pos() const { return P_; }
    // Token position of each slot: (B, G, L) when per_row_positions(), else (L); -1 = empty.
    virtual bool per_row_positions() const = 0;
    virtual const std::vector<int32_t>& token_positions() const = 0;
    // Slots per row of token_positions() and how many of them hold tokens: the pool for
    // per-head lengths (-1 where another head keeps the slot), else cache_length() and
    // current_length(). What readers of the positions use, whatever the layout.
    int64_t position_row_length() const { return pool() > 0 ? pool() : L_; }
    int64_t position_row_filled() const { return pool() > 0 ? pool() : T_; }

    // ---- telemetry hooks ----------------------------------------------------------------
    // Current eviction scores per slot (B, G, L) (lower = evicted first); empty if none.
    virtual std::vector<float> slot_scores() const { return {}; }

    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // What the policy does beyond this core (policy_capabilities.h), attached by the registry
    // when it builds the policy (build_policy); fixed from then on.
    const PolicyCapabilities& capabilities() const { return caps_; }
    // ---- end of capabilities ----

   protected:
    KVPolicy(int64_t L, int64_t groups) : L_(L), G_(groups) {}
    int64_t L_;
    int64_t G_;
    int64_t B_ = 0;
    int64_t T_ = 0;
    int64_t P_ = 0;

   private:
    int64_t pool() const { return caps_.pooled_slots ? caps_.pooled_slots->pool_slots() : 0; }
    friend std::unique_ptr<KVPolicy> build_policy(const PolicyInfo& info, const PolicyArgs& args);
    PolicyCapabilities caps_;
};

// ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
// Slots of the per-head pool of p (PooledSlots), 0 when its heads keep one slot row each.
inline int64_t pool_slots(const KVPolicy& p) {
    return p.capabilities().pooled_slots ? p.capabilities().pooled_slots->pool_slots() : 0;
}
// ---- end of capabilities ----

// Text access for policies that look at the prompt (smart-lastrec): decode ids (skipping
// special tokens) and encode text (no special tokens added).
struct TextCodec {
    std::function<std::string(const std::vector<int32_t>&)> decode;
    std::function<std::vector<int32_t>(const std::string&)> encode;
};

// Build the policy named by cfg.policy() (looked up in policy_registry()) for layer `layer`
// with cache length L and G KV heads.
std::unique_ptr<KVPolicy> make_policy(const KVCacheConfig& cfg, int64_t L, int64_t groups, const TextCodec* text = nullptr,
                                      int64_t layer = 0);

// "The chunk straddles the point where the cache becomes full" and similar: one message.
[[noreturn]] void throw_chunk_error(const char* policy, int64_t n, int64_t allowed, int64_t T, int64_t L, const char* why);

}  // namespace kv
