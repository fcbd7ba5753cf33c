// The gradient pipeline's KV cache for one layer (reference §9.3-§9.5): slots come from the
// replay log, K/V are kept at full precision, and no scores are computed. In recording mode
// every chunk keeps only its delta (the rows it overwrote, before the write), so the reverse
// pass can walk chunks right to left, rebuilding each earlier buffer from the later one while
// it moves the gradient w.r.t. the buffer backwards (the fused scatter + SDPA backward of
// §5.7, with grace-ring moves). Memory per chunk is O(B G n D), not O(B G L D).
#pragma once

#include <memory>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/kv/buffers/buffer_common.h"
#include "engine/kv/kv_policy.h"
#include "engine/kv/read_selection.h"
#include "engine/model/attention.h"

namespace kv {

// A layer's cache state between chunks: what a KV checkpoint stores.
struct ReplayKVState {
    Tensor K, V;               // (B, G, L, D); undefined for a layer without a token cache
    std::vector<int32_t> pos;  // (B G, L) token position per slot, -1 = empty
    int64_t length = 0;        // valid slots [0, length)
    int64_t chunk = 0;         // index of the next chunk
    int64_t input_pos = 0;     // tokens seen
    int64_t pool = 0;          // > 0: per-head lengths, K/V (B, 1, pool, D) and pos (B G, pool)
    LayerState state;          // a layer without a token cache (short convolution): its state, else empty
};

class ReplayLayerCache {
 public:
    // plans: the layer's replay log (one plan per chunk, the prefill first).
    ReplayLayerCache(int layer, int64_t B, int64_t G, int64_t L, int64_t D, DType dtype, Device device,
                     const std::vector<SlotPlan>* plans);

    // Start from a checkpoint (copied in) or, with nullptr, from the empty cache at chunk 0.
    void load(const ReplayKVState* state);
    // A copy of the current state on `device` in memory category `cat`.
    ReplayKVState snapshot(Device device, MemCategory cat) const;
    int64_t next_chunk() const { return chunk_; }
    int64_t length() const { return length_; }
    const Tensor& keys() const { return K_; }
    const Tensor& values() const { return V_; }

    // One chunk forward: apply the logged plan to (k, v) (B, G, n, D), then y = attention of q
    // (B, NH, n, D) over the buffer. With `record`, keeps the chunk's delta for backward().
    void forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, Tensor& y, bool record);

    // Gradient w.r.t. the current buffer state (zero until set); a cell passes its start's
    // gradient to the cell on its left through these.
    void set_state_grad(const Tensor* dK, const Tensor* dV);
    // Cross-layer KV sharing: a later layer's queries q (B, NH, n, D) at input_pos over this
    // layer's buffer as it stands after the same chunk (no slot changes), and the reverse of
    // that read, which must run before this layer's own backward() of the chunk: dq is written
    // and the buffer's gradient receives the read's. Per-head pools, read selections and key
    // re-rotation are refused by name.
    void forward_shared(int reader, const Tensor& q, int64_t input_pos, float scale, int window, Tensor& y) const;
    void backward_shared(int reader, const Tensor& q, const Tensor& dy, float scale, int window, Tensor& dq);
    Tensor& state_grad_k() { return dK_; }
    Tensor& state_grad_v() { return dV_; }
    // Reverse of the most recent recorded chunk: dq, and dk/dv of its new keys/values; then
    // the buffer and its gradient step back to the state before that chunk.
    void backward(const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv);
    size_t recorded_chunks() const { return records_.size(); }
    // A policy that reads a selection of the cache (engine/kv/read_selection.h; null: every
    // slot): chunks after the prefill attend over what each query selects, exactly as the live
    // cache did, and the gradient flows through the selected slots only.
    void set_read_selection(std::shared_ptr<const ReadSelection> s) { selection_ = std::move(s); }
    // The layer's sliding window (ModelConfig::layer_window; 0 = none): forward and backward
    // SDPA mask keys at positions <= p - window, as the live cache did. Per-head pools and
    // read selections have no window and refuse one.
    void set_window(int window) { window_ = window; }
    int window() const { return window_; }
    // The RoPE frequencies the model rotated this layer's q and k with (null or empty: NoPE),
    // for plans that re-rotate the kept keys (SlotPlan::rerotate, engine/kv/key_rotation.h):
    // forward turns keys and queries as the live cache did, backward turns the gradients back.
    void set_rope_frequencies(const std::vector<double>* inv_freq) { freq_ = inv_freq ? *inv_freq : std::vector<double>(); }
    // Drop recorded deltas and gradients (end of a cell).
    void clear_records();
    // The state of a layer without a token cache (LayerAttention::layer_state): the block
    // keeps it up to date, load() and snapshot() carry it with the cache's checkpoint.
    LayerState* layer_state() { return &state_; }

 private:
    struct ChunkRecord {
        SlotPlan plan;
        Tensor overwritten;            // int32 (B|1, G|1, m, 1): slots written (moves' targets, then the new tokens)
        Tensor old_k, old_v;           // (B, G, m, D) their content before the chunk
        std::vector<int32_t> old_pos;  // (B G, m)
        int64_t length_before = 0;
        int64_t input_pos = 0;
        std::vector<int32_t> sel;      // what each query read (ReadSelection::attend); empty = every slot
        MergedValues merged;           // the plan's merged slots before its value merges
        // key re-rotation: each slot's turn (B G, L), the queries' turn and the frequencies;
        // shift empty when nothing turned
        std::vector<int32_t> shift;
        int64_t qshift = 0;
        std::vector<double> freq;
    };
    // Key re-rotation after the plan of the current chunk: turns K_, returns q turned; records.
    Tensor rerotate(const SlotPlan& plan, const Tensor& q, ChunkRecord* rec);
    bool selects() const { return selection_ && selection_->selects(length_); }
    Tensor positions_tensor() const;
    void ensure_grads();
    // Per-head lengths (PooledSlots, engine/kv/policy_capabilities.h): the layer's plans target one pool of S slots
    // per batch row (their length_after is S > L); storage becomes (B, 1, S, D).
    void use_pool(int64_t S);
    void forward_pooled(const SlotPlan& plan, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale,
                        Tensor& y, bool record);
    void backward_pooled(const Tensor& q, const Tensor& dy, float scale, Tensor& dq, Tensor& dk, Tensor& dv);
    int64_t pool_ = 0;

    int layer_;
    int64_t B_, G_, L_, D_;
    DType dtype_;
    Device device_;
    const std::vector<SlotPlan>* plans_;
    Tensor K_, V_, dK_, dV_;
    std::vector<int32_t> pos_;
    std::vector<int32_t> rope_;  // (B G, L) scratch of rerotate(): each slot's RoPE position
    std::vector<double> freq_;
    int64_t length_ = 0, chunk_ = 0, input_pos_ = 0;
    std::vector<ChunkRecord> records_;
    std::shared_ptr<const ReadSelection> selection_;
    int window_ = 0;
    LayerState state_;
};

}  // namespace kv
