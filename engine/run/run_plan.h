// How a run configuration becomes a cache configuration and a chunk plan: the one planner that
// evaluation and training share (so the two cannot drift), and what a comparison checks when it
// asks whether two runs step through a sequence alike.
#pragma once

#include <cstdint>

#include "engine/core/model_config.h"
#include "engine/driver/chunk_plan.h"
#include "engine/kv/kv_config.h"
#include "kernels/common/dtype.h"
#include "run_config.h"

namespace kv {

// The run's cache configuration for a model computing in `act_dtype`: max_chunk_size defaults
// to the chunk size (1.5x when randomized, as keys_values' CLI), widened by kChunkSnapTokens
// when layer lengths differ (the plan may stretch a chunk that far to end on one of them).
KVCacheConfig run_cache_config(const RunConfig& cfg, const ModelConfig& mc, DType act_dtype);
// The largest chunk a windowed layer's ring must take in this run (window - 1 + it slots).
int64_t run_ring_chunk(const RunConfig& cfg, const ModelConfig& mc);
// How the model's layers take the run's byte budget (budget_layers with the largest chunk the
// run's plan will use; seq_length: the tokens a sample reaches).
BudgetLayers run_budget_layers(const RunConfig& cfg, const ModelConfig& mc, int64_t seq_length);

// The chunks and cells a sample of T tokens is processed in, with the chunk sizes' random
// draws seeded by `seed` when the run randomizes them.
ChunkPlan run_chunk_plan(const RunConfig& cfg, const KVCacheConfig& kc, const ModelConfig& mc, int64_t T, uint64_t seed);

}  // namespace kv
