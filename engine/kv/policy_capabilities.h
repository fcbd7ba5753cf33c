// Capabilities: what some policies do beyond the core of KVPolicy (plan, apply, score). Each is
// its own interface; a policy class implements the ones it has, and the registry attaches them
// when it builds the policy (build_policy, policy_registry.h), so a caller asks
// policy.capabilities() for the object instead of the core growing a hook per policy kind.
// A policy without a capability never hears of it. Only engine/kv asks (the layer check,
// tools/layers/check_layers.py, forbids the names between the markers elsewhere); the rest of
// the engine reaches them through the generic calls of docs/ARCHITECTURE.md.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

class KVPolicy;
class Tensor;

// One piece of a context-reconstruction pass (kvzip; engine/kv/context_reconstruction.h): m
// queries at positions [query_pos, query_pos + m) that re-read the tokens at positions
// [chunk_begin, chunk_end), attending to the cache and causally to their own keys. Row-major
// host copies; cache_keys are slots [0, T) as the buffer stores them (T = current_length()).
struct ReconstructionInput {
    std::vector<float> queries;     // (B, NH, m, D), rotated
    std::vector<float> own_keys;    // (B, G, m, D), rotated
    std::vector<float> cache_keys;  // (B, G, T, D)
    int64_t query_heads = 0, m = 0, head_dim = 0;
    int64_t query_pos = 0, chunk_begin = 0, chunk_end = 0;
    float scale = 0.0f;
};

// The token ids a reconstruction piece starts with: `first` for the sequence's first piece,
// else `later` followed by the `quoted` tokens before the piece; then `suffix`, then the piece
// (at most `piece` tokens of the chunk).
struct ReconstructionPrompt {
    std::vector<int32_t> first, later, suffix;
    int64_t quoted = 0;
    int64_t piece = 0;
};

// A read policy (quest) attends over a selection of the cache instead of all of it: LayerCache
// calls attend_selection() in place of ops::sdpa_ (K, V: slots [0, T) read from the buffer);
// the gradient replay reaches the same selection through read_selection.h.
class SelectsReads {
   public:
    virtual ~SelectsReads() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // window: the layer's sliding window, masking as ops::sdpa_ does.
    virtual void attend_selection(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& kpos, const Tensor& qpos,
                                  float scale, Tensor* wsum, int window) = 0;
    // ---- end of capabilities ----
};

// A policy that scores by reconstruction (kvzip): after each chunk the pass
// (context_reconstruction.h) runs the prompt and the chunk's tokens again through the model
// without caching them, and hands each layer's piece to observe_reconstruction() before the
// next chunk is planned.
class ReconstructsContext {
   public:
    virtual ~ReconstructsContext() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    virtual ReconstructionPrompt reconstruction_prompt() const = 0;
    virtual void observe_reconstruction(const ReconstructionInput& in) = 0;
    // ---- end of capabilities ----
};

// Variable per-head lengths (ada-*, lukv-*, duo's mixed layers): the layer's slots form one pool of
// pool_slots() per batch row, shared by its G heads, each slot kept by one head (a head may
// hold more slots than another; storage is the pool, exactly the slots kept).
// token_positions() is then (B, G, pool_slots) with a slot's position in the row of the head
// keeping it, -1 in the others; plans target pool slots (rows = B * G, length_after =
// pool_slots), and cache_length() / current_length() are the per-head mean (pool_slots / G
// when full). Fixed when the policy is made; 0 = the layer keeps one slot row per head after all
// (duo with one capacity for every head). Read it through pool_slots(policy) (kv_policy.h).
class PooledSlots {
   public:
    virtual ~PooledSlots() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    virtual int64_t pool_slots() const = 0;
    // ---- end of capabilities ----
};

// Layer lengths decided during the sequence, across layers (cake).
class CrossLayerLengths {
   public:
    virtual ~CrossLayerLengths() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // Called once by the model-level cache with every layer's policy it runs on (index = layer),
    // so that the layers can share their state.
    virtual void link_layers(const std::vector<KVPolicy*>& layers) = 0;
    // Called before every call of the layer (prefill and chunks, live and replayed alike) with
    // its position and n; returns the slots the layer has from now on (the buffer follows).
    virtual int64_t begin_call(int64_t input_pos, int64_t n) = 0;
    // ---- end of capabilities ----
};

// Per-row state beyond slot positions that beam search must reorder (quest's page bounds):
// batch row b becomes row src[b]. Position-only policies without such state need none.
class ReordersBatch {
   public:
    virtual ~ReordersBatch() = default;
    virtual void reorder_batch(const std::vector<int32_t>& src) = 0;
};

// Policies that read the text of each chunk (smart-lastrec, policies written in Python): the
// chunk's token ids (B, n) row-major, before prefill() / prepare(), when the call brings them.
class ReadsTokens {
   public:
    virtual ~ReadsTokens() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    virtual void observe_tokens(const std::vector<int32_t>& ids, int64_t n) = 0;
    // ---- end of capabilities ----
};

// Policies that move the RoPE angles of the kept keys after each plan (key-rerotation-*,
// engine/kv/key_rotation.h): LayerCache turns the stored keys and the chunk's queries by these
// shifts after apply(), live and replayed alike. Token positions (masks, logs) never change.
class RerotatesKeys {
   public:
    virtual ~RerotatesKeys() = default;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // After the last prefill/apply: per (row, slot) how many positions the slot's key turns
    // (rows x cache_length(); rows = B G, or 1 for positions shared by every row), and how
    // many the chunk's queries turn.
    virtual const std::vector<int32_t>& key_shifts() const = 0;
    virtual int64_t key_shift_rows() const = 0;
    virtual int64_t chunk_query_shift() const = 0;
    // ---- end of capabilities ----
};

// The capabilities attached to one policy; null = the policy has none of that kind.
struct PolicyCapabilities {
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    SelectsReads* selects_reads = nullptr;
    ReconstructsContext* reconstructs_context = nullptr;
    PooledSlots* pooled_slots = nullptr;
    CrossLayerLengths* cross_layer_lengths = nullptr;
    ReordersBatch* reorders_batch = nullptr;
    ReadsTokens* reads_tokens = nullptr;
    RerotatesKeys* rerotates_keys = nullptr;
    // ---- end of capabilities ----
};

}  // namespace kv
