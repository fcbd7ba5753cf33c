// The run's cache configuration and chunk plan (see run_plan.h).
#include "run_plan.h"

#include <vector>

#include "engine/driver/long_context.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/kv/window_layer.h"

namespace kv {

namespace {
// The largest chunk the plan draws: the chunk size, 1.5x when randomized (keys_values' CLI).
int64_t planned_chunk(const RunConfig& cfg) {
    return cfg.driver.randomize_chunk_sizes ? cfg.driver.chunk_size + cfg.driver.chunk_size / 2 : cfg.driver.chunk_size;
}
}  // namespace

int64_t run_ring_chunk(const RunConfig& cfg, const ModelConfig& mc) {
    // The chunk the plan uses, stretched by kChunkSnapTokens when windowed and full layers mix
    // (their lengths differ), as run_cache_config widens max_chunk_size.
    if (cfg.kv_cache.max_chunk_size > 0) return cfg.kv_cache.max_chunk_size;
    const int64_t c = planned_chunk(cfg);
    for (int64_t l = 1; l < mc.num_layers; ++l)
        if (mc.layer_window(l) != mc.layer_window(0)) return c + kChunkSnapTokens;
    return c;
}

BudgetLayers run_budget_layers(const RunConfig& cfg, const ModelConfig& mc, int64_t seq_length) {
    KVCacheConfig ring = cfg.kv_cache;  // rings hold window - 1 + the largest chunk
    ring.max_chunk_size = run_ring_chunk(cfg, mc);
    return budget_layers(ring, mc, seq_length);
}

KVCacheConfig run_cache_config(const RunConfig& cfg, const ModelConfig& mc, DType act_dtype) {
    // A byte budget becomes the cache length here, so the chunk plan and the cache agree on it;
    // the windowed layers' rings take their part of it first.
    KVCacheConfig kc = apply_kv_budget(cfg.kv_cache, mc.num_layers, mc.cache_kv_heads(), mc.cache_head_dim(), act_dtype,
                                       cfg.data.seq_length, mc.cache_tensors(), run_budget_layers(cfg, mc, cfg.data.seq_length));
    kc.dtype = act_dtype;
    if (kc.max_chunk_size == 0) {
        kc.max_chunk_size = planned_chunk(cfg);
        // With layers of different lengths (pyramidkv, a layer length rule) the plan stretches a
        // chunk ending just short of one of them by up to kChunkSnapTokens; a top-k of the bare
        // chunk size would refuse that chunk in every full layer.
        const int64_t nl = mc.num_layers;
        for (int64_t l = 1; l < nl; ++l)
            if (kc.length_for_layer(l, 0, nl) != kc.length_for_layer(0, 0, nl) || mc.layer_window(l) != mc.layer_window(0)) {
                kc.max_chunk_size += kChunkSnapTokens;
                break;
            }
    }
    return kc;
}

ChunkPlan run_chunk_plan(const RunConfig& cfg, const KVCacheConfig& kc, const ModelConfig& mc, int64_t T, uint64_t seed) {
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < mc.num_layers; ++l) Ls.push_back(kc.length_for_layer(l, T, mc.num_layers));
    policy_plan_lengths(kc, mc.cache_kv_heads(), Ls);
    // Windowed layers keep their ring whatever the policy (engine/kv/window_layer.h).
    const std::vector<int64_t> rings = layer_lengths(kc, mc, T);
    for (int64_t l = 0; l < mc.num_layers; ++l)
        if (mc.layer_window(l) > 0) Ls[size_t(l)] = rings[size_t(l)];
    ChunkPlanOptions po;
    po.chunk_size = cfg.driver.chunk_size;
    po.prefill = cfg.driver.prefill_length;
    po.randomize = cfg.driver.randomize_chunk_sizes;
    po.seed = seed;
    po.cell_factor = cell_factor(mc);
    po.chunks_per_cell_multiplier = cfg.grad.chunks_per_cell_multiplier;
    return plan_chunks(T, Ls, po);
}

}  // namespace kv
