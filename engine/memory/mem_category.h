// What an allocation is for. Every byte the engine allocates carries one of these, so memory
// timelines can be stacked by purpose (weights vs. KV cache vs. checkpoints vs. activations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kv {

enum class MemCategory : uint8_t {
    WEIGHTS = 0,
    KV_CACHE,
    KV_CHECKPOINT,
    ACTIVATION_CHECKPOINT,
    ACTIVATIONS,
    GRADIENTS,
    OPTIMIZER,
    WORKSPACE,
    KV_OFFLOAD,  // KV buffers parked in host memory (offload strategy), apart from kv_cache
    KV_FIDELITY,  // --fidelity: the uncompressed shadow of K/V the dense comparison attends over
    KV_QUANT_SCALES,  // KIVI buffers: the f16 scales and minima of the packed codes (codes are kv_cache)
    KV_RESIDUAL,      // KIVI buffers: the full-precision residual window (groups not yet packed)
    COUNT
};

constexpr size_t kNumMemCategories = size_t(MemCategory::COUNT);

// "weights", "kv_cache", ... (stable: stored in session files and exports).
const char* mem_category_name(MemCategory c);
// Inverse of mem_category_name; throws kv::Error listing the valid names.
MemCategory mem_category_from_name(const std::string& name);

}  // namespace kv
