// Internals shared by the buffer implementations (not part of the KV cache API).
#pragma once

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "engine/kv/buffers/kv_buffer.h"

namespace kv {

// A layer buffer that borrows the shared working buffer and must write back before another
// layer takes it over.
class WorkingBufferUser {
   public:
    virtual ~WorkingBufferUser() = default;
    virtual void write_back() = 0;
};

struct BufferShared {
    Device device{};
    DType act = DType::F32;
    int64_t max_L = 0, G = 0, D = 0;
    Tensor Kw, Vw;                       // (B, G, max_L, D): the dequantized working buffer
    WorkingBufferUser* owner = nullptr;  // the quantized layer buffer currently associated
    WorkingBufferUser* resident = nullptr;  // offload: the layer whose storage is on the device
    KVBuffer* staged = nullptr;             // offload: the layer being (or already) prefetched
    KVBuffer* next = nullptr;               // offload: prefetch this one once a layer becomes resident
    int64_t prefetch_hits = 0, prefetch_misses = 0;  // restores served by a prefetch / copied on demand
    void ensure(int64_t B) {
        if (Kw.defined() && Kw.size(0) >= B) return;
        Kw = Tensor::zeros({B, G, max_L, D}, act, {device, MemCategory::KV_CACHE, "dequantized working keys"});
        Vw = Tensor::zeros({B, G, max_L, D}, act, {device, MemCategory::KV_CACHE, "dequantized working values"});
    }
};

// Apply a plan's moves and writes to full-precision (B, G, L, D) tensors.
void apply_plan_to(Tensor& K, Tensor& V, const SlotPlan& plan, const Tensor& k, const Tensor& v);
// The same for a buffer whose values are its keys (BufferParams::values_are_keys).
void apply_plan_to_keys(Tensor& K, const SlotPlan& plan, const Tensor& k);

std::unique_ptr<KVBuffer> make_default_buffer(const BufferParams& p, DType dtype);
// kf, vf: the formats of keys and values (equal unless the buffer has asymmetric widths).
std::unique_ptr<KVBuffer> make_quantized_buffer(const KVCacheConfig& cfg, const BufferParams& p, QuantFormat kf, QuantFormat vf,
                                                std::string name, std::shared_ptr<BufferShared> shared);
std::unique_ptr<KVBuffer> make_kivi_buffer(const KVCacheConfig& cfg, const BufferParams& p, int bits);
std::unique_ptr<KVBuffer> make_think_buffer(const KVCacheConfig& cfg, const BufferParams& p);
// compact: free whole blocks after each chunk (KVBuffer::compact).
std::unique_ptr<KVBuffer> make_paged_buffer(const BufferParams& p, DType dtype, int64_t block_size, bool compact = false);
std::unique_ptr<KVBuffer> make_offload_buffer(std::unique_ptr<KVBuffer> inner, const BufferParams& p,
                                              std::shared_ptr<BufferShared> shared);

}  // namespace kv
