// One layer's cache: a policy (which slots) plus a buffer (where K/V live). attend() runs one
// chunk: prefill (attention on the raw new k/v) or plan -> write -> attention over the whole
// buffer masked by token position -> policy update with the weight sums when needed.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/kv/buffers/kv_buffer.h"
#include "engine/kv/chunk_input.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/replay_log.h"

namespace kv {

// Per-step telemetry: called after each chunk of a layer (plan, policy state, weights).
struct LayerStep {
    int layer = 0;
    int64_t chunk = 0;                 // chunk index within the sequence (0 = prefill)
    const SlotPlan* plan = nullptr;
    const KVPolicy* policy = nullptr;
    const std::vector<float>* weights = nullptr;  // (B, G, T) or null
};
using LayerStepHook = std::function<void(const LayerStep&)>;

// Per-head lengths (pool_slots(policy) > 0, PooledSlots), shared with the gradient replay cache: a
// policy plan (rows B * G) as a plan over the (B, 1, S, D) pool (rows B, G n entries each);
// head g's positions as (B, 1, S) with other heads' slots never visible; attention of q
// (B, NH, n, D) over the pool, weight sums into wsum (B, G, S).
SlotPlan to_pool_plan(const SlotPlan& plan, int64_t B, int64_t G);
Tensor pool_group_positions(const std::vector<int32_t>& pos, int64_t B, int64_t G, int64_t S, int64_t g, Device device);
void pooled_attention(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const std::vector<int32_t>& pos, int64_t G,
                      const Tensor& qpos, float scale, Tensor* wsum, int window = 0);

class LayerCache {
   public:
    LayerCache(int layer, std::unique_ptr<KVPolicy> policy, std::unique_ptr<KVBuffer> buffer);

    // window: the layer's sliding window (LayerAttention::attend), applied by slot position to
    // whatever the policy kept. in: the chunk's inputs (chunk_input.h):
    //   ids     handed to a policy that reads tokens before it plans; (B, n) or an error.
    //   replay  this layer's plan for the call is (*replay)[layer][chunks()] instead of the
    //           policy's (prefills place their tokens as always); the policy is not updated.
    //   lse     (fidelity, engine/driver/fidelity.*): when the chunk's attention is the plain
    //           SDPA over the buffer's slots, each query row's log-sum-exp is written there as
    //           well ((B, NH, n) f32|f64, ops::sdpa_); lse_written() says whether it was (not
    //           for a prefill, pooled, fused or policy-read attention, nor where
    //           ops::sdpa_lse_supported is false).
    void attend(const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window, Tensor& y,
                const ChunkInput& in = {});
    // Cross-layer KV sharing: layer `reader`'s queries q (B, NH, n, D) for positions
    // input_pos.. attend over what this layer keeps after its own call for the same chunk (it
    // must have just taken positions input_pos .. input_pos + n - 1), masked by slot position and
    // `window` exactly as this layer's own queries were. The policy is neither asked nor
    // updated: it acts on this (source) layer alone, and the reader sees exactly what it keeps.
    void attend_shared(int reader, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y);
    // Benchmarks only: a prefill of k, v (B, G, n, D) without computing attention, so a
    // decode or chunk step can be timed at a large context without paying for the prefill.
    void prefill_without_attention(const Tensor& k, const Tensor& v);
    // A new sequence: input position 0 (storage stays allocated).
    void reset();

    KVPolicy& policy() { return *policy_; }
    const KVPolicy& policy() const { return *policy_; }
    KVBuffer& buffer() { return *buffer_; }
    const KVBuffer& buffer() const { return *buffer_; }
    ReplayLog& replay_log() { return log_; }
    // Bytes of K and V of the (b, head, slot) entries a head keeps (logical bytes), beside
    // buffer().bytes(), what the buffer holds for them (physical: whole blocks, the whole pool).
    size_t logical_bytes() const;
    int64_t input_pos() const { return policy_->input_pos(); }
    int64_t chunks() const { return chunk_; }

    void set_replay_logging(bool on) { logging_ = on; }
    void set_step_hook(LayerStepHook h) { hook_ = std::move(h); }
    // The RoPE frequencies of q and k (null: unrotated), for policies that read queries.
    void set_rope_frequencies(const std::vector<double>* inv_freq) { rope_ = inv_freq; }
    // The next call's attention input (B, n, E) (LayerAttention::set_layer_input), for policies
    // that read hidden states; the call consumes it, so a call without one never sees a stale one.
    void set_layer_input(const Tensor& h) { input_ = h; }
    // Telemetry pass number of this cache's steps (0 = the first forward; replays 1, 2, ...).
    void set_trace_pass(int pass) { trace_pass_ = pass; }
    bool lse_written() const { return lse_written_; }

    // The (B|1, G|1, T) int32 positions tensor of the current state (for attention).
    Tensor positions_tensor(Device device) const;

    // Context reconstruction (kvzip, engine/kv/context_reconstruction.*): while armed, a chunk's
    // telemetry (trace step, step hook) waits until finish_reconstruction(), so both show the
    // scores the reconstruction left, which the next chunk evicts by.
    void set_reconstruction_armed(bool on);
    void finish_reconstruction();

   private:
    // How a chunk after the prefill attends, fixed by the policy and buffer at construction:
    // over the per-head pool (PooledSlots), the buffer's own packed attention (KIVI), the
    // policy's selection of the slots (SelectsReads), or SDPA over every slot.
    enum class ReadPath { POOLED, FUSED, SELECTION, SDPA };
    static ReadPath choose_read_path(const KVPolicy& policy, const KVBuffer& buffer);
    bool pooled() const { return read_path_ == ReadPath::POOLED; }
    SlotPlan pooled_prefill_plan(int64_t B, int64_t n) const;
    void pooled_sdpa(Tensor& y, const Tensor& q, const Tensor& K, const Tensor& V, const Tensor& qpos, float scale, Tensor* wsum,
                     int window) const;
    InsertFeatures features(const Tensor& q, const Tensor& k, const Tensor& v, float scale) const;
    void record_step(const SlotPlan& plan) const;
    void finish_step(const SlotPlan& plan, const std::vector<float>* w, bool replayed);
    void compact_buffer();
    // Key re-rotation (RerotatesKeys): turns the stored keys by the policy's shifts; returns q turned likewise.
    Tensor rerotate(const Tensor& q);

    int layer_;
    int64_t head_dim_ = 0;  // D of the last call's keys (logical bytes)
    std::unique_ptr<KVPolicy> policy_;
    std::unique_ptr<KVBuffer> buffer_;
    ReadPath read_path_;
    ReplayLog log_;
    bool logging_ = false;
    LayerStepHook hook_;
    const std::vector<double>* rope_ = nullptr;
    Tensor input_;  // the pending call's attention input, or undefined
    int64_t chunk_ = 0;
    int trace_pass_ = 0;
    bool rec_armed_ = false;
    bool rec_pending_ = false;
    SlotPlan rec_plan_;
    bool lse_written_ = false;
};

}  // namespace kv
