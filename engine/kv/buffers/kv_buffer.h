// Where a layer's keys and values live, independent of the policy: full precision
// (f32/bf16/f16), quantized rows (q8, q4, nf4, q8_0, q4_0) behind a dequantized working buffer
// shared by all layers, paged blocks, or parked in host memory. A buffer only executes plans;
// it never decides slots.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_policy.h"

namespace kv {

class KVBuffer {
   public:
    virtual ~KVBuffer() = default;
    virtual std::string name() const = 0;
    // Storage for batch B; allocated at the first prefill, kept across sequences.
    virtual void allocate(int64_t batch) = 0;
    virtual bool allocated() const = 0;
    // Free the storage (end of a pass); the next prefill allocates again.
    virtual void release() = 0;
    // The chunk's queries (B, NH, n, D), handed just before its keys are written (prefill or
    // write): buffers whose layout follows the queries (think's key channels) read them.
    virtual void observe_queries(const Tensor& q) { (void)q; }
    // Whether observe_queries reads the queries (a chunk's queries formed only on demand, as
    // multi-head latent attention's expanded chunks form theirs, are formed for such a buffer).
    virtual bool observes_queries() const { return false; }
    // Whether each (b, g) row must be one KV head (think keeps channels per head), which
    // per-head pools of slots (PooledSlots) cannot give.
    virtual bool per_head_rows() const { return false; }
    // New k, v (B, G, n, D) into slots [0, n).
    virtual void prefill(const Tensor& k, const Tensor& v) = 0;
    // Moves of the plan (within the buffer), then new tokens into the plan's targets.
    virtual void write(const SlotPlan& plan, const Tensor& k, const Tensor& v) = 0;
    // The plan's value merges (SlotPlan::merge_*: merging-*, cam-*), applied before write()
    // moves or overwrites anything. Full-precision buffers apply them; the others refuse.
    virtual void merge_values(const SlotPlan& plan) {
        (void)plan;
        throw Error(str("the '", name(), "' buffer cannot merge values (merging and cam policies need an unpaged full-precision buffer: "
                        "default, f32, bf16 or f16, without paged_block_size or cpu_offload)"));
    }
    // Full-precision (B, G, T, D) keys and values of slots [0, T) for attention.
    virtual std::pair<Tensor, Tensor> read(int64_t T) = 0;
    // Buffers that attend over their own storage (KIVI: dequantize-on-read inside SDPA): y =
    // sdpa(q, slots [0, T)) with the masking of ops::sdpa_ (kpos covers the T slots), weight
    // sums into wsum when given. read() then serves only other callers.
    virtual bool fused_attention() const { return false; }
    // window: the layer's sliding window, masking as ops::sdpa_ does.
    virtual void attend(Tensor& y, const Tensor& q, int64_t T, const Tensor& kpos, const Tensor& qpos, float scale, Tensor* wsum,
                        int window = 0) {
        (void)y, (void)q, (void)T, (void)kpos, (void)qpos, (void)scale, (void)wsum, (void)window;
        throw Error(str("the '", name(), "' buffer has no fused attention"));
    }
    // Quantized buffers: per-token |k - deq(q(k))| + |v - deq(q(v))|, (B, G, n) row-major.
    virtual std::vector<float> quant_errors(const Tensor& k, const Tensor& v) { (void)k, (void)v; return {}; }
    // Persist anything still held elsewhere (dirty working rows, offloaded copies).
    virtual void flush() {}
    // Beam search: row b of the batch becomes a copy of row src[b] (full-precision buffers).
    virtual void reorder_batch(const std::vector<int32_t>& src) {
        (void)src;
        throw Error(str("the '", name(), "' buffer cannot reorder its batch (beam search needs a full-precision buffer)"));
    }
    // Offloaded buffers: start copying this layer's parked state back to the device on a copy
    // thread, so it is there when the layer is next used (a hint; default: nothing).
    virtual void prefetch() {}
    // The tensors holding this layer's persistent state (for offloading); empty if none.
    virtual std::vector<Tensor*> storage_tensors() { return {}; }
    // Policies that change a layer's length during the sequence (cake): the buffer's slots per
    // (b, g) row (-1: cannot change), and a new count keeping slots [0, min(old, new)).
    virtual int64_t slots() const { return -1; }
    virtual void resize_slots(int64_t L) {
        (void)L;
        throw Error(str("the '", name(), "' buffer cannot change a layer's length (full-precision buffers can)"));
    }
    // Paged storage with --kv_cache.compact: after a chunk, kept (B, L) row-major says which
    // slots some head of the row still keeps; the others are unmapped and kept slots move so
    // whole blocks are freed (slot numbers stay). Returns the slots moved.
    virtual bool compacts() const { return false; }
    virtual int64_t compact(const std::vector<uint8_t>& kept) { (void)kept; return 0; }
    // Exact storage bytes of K and V (scales and zero points included): what the buffer holds
    // (physical: whole blocks of a paged buffer, the whole pool of per-head lengths), and per
    // element. The bytes of the slots kept (logical) are LayerCache::logical_bytes().
    virtual size_t bytes() const = 0;
    virtual double bits_per_element() const = 0;
    // Whether the values are the keys (a latent-attention layer's latent cache,
    // BufferParams::values_are_keys): one stored vector per slot, read() returns it twice.
    virtual bool values_are_keys() const { return false; }
};

// Shared state of all layers' buffers in one cache (the dequantized working buffer of
// quantized layers: only one layer is "associated" with it at a time).
struct BufferShared;

struct BufferParams {
    int64_t layer = 0;
    int64_t L = 0;       // this layer's cache length
    int64_t G = 0;       // KV heads
    int64_t D = 0;       // head size
    Device device{};
    DType act_dtype = DType::F32;  // dtype of attention inputs (and of default buffers unless named)
    // The values are the keys (ModelConfig::latent_cache): only K is stored, v of every write is
    // ignored. Full-precision buffers only (make_buffer refuses the others).
    bool values_are_keys = false;
};

std::unique_ptr<KVBuffer> make_buffer(const KVCacheConfig& cfg, const BufferParams& p, std::shared_ptr<BufferShared> shared);
std::shared_ptr<BufferShared> make_buffer_shared(const KVCacheConfig& cfg, int64_t max_L, int64_t G, int64_t D, Device device,
                                                 DType act_dtype);

// Index tensor (rows|1 over (B, G), m, 1) int32 for slots, broadcast to (B, G, m, D) by callers.
Tensor slot_index(const std::vector<int32_t>& slots, int64_t rows, int64_t B, int64_t G, int64_t m, Device device);

}  // namespace kv
