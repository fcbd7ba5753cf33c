// Sliding-window layers keep their window by rule, whatever the run's policy: a ring of the
// last window - 1 + (largest chunk) tokens, so the first query of a chunk still sees the
// window - 1 keys before it. The run's policy acts only on the layers that attend to every
// earlier token (docs/MODELS.md, "Sliding-window attention").
#pragma once

#include <memory>
#include <vector>

#include "engine/core/model_config.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/kv_policy.h"

namespace kv {

// Slots of a layer with this window: window - 1 + cfg.max_chunk_size; with no largest chunk
// given (0), the whole sequence when its length is known, else 2 * window - 1. Never more than
// seq_length when it is known (> 0).
int64_t window_layer_length(const KVCacheConfig& cfg, int64_t window, int64_t seq_length);

// Every layer's slots: windowed layers by the rule above, the others cfg.length_for_layer
// (0 = seq_length).
std::vector<int64_t> layer_lengths(const KVCacheConfig& cfg, const ModelConfig& model, int64_t seq_length);

// How the model's layers take a byte budget (apply_kv_budget): the policy's length in each
// full-attention layer with its own cache, the rings of the windowed ones (cfg.max_chunk_size
// as the run plans it) besides; KV-shared and convolution layers hold none.
BudgetLayers budget_layers(const KVCacheConfig& cfg, const ModelConfig& model, int64_t seq_length);

// The ring of a windowed layer ("window"): token position p lives in slot p mod L, never
// scored, never counted as a policy's eviction.
std::unique_ptr<KVPolicy> make_window_policy(int64_t L, int64_t groups, int64_t window);
bool is_window_policy(const KVPolicy& p);

}  // namespace kv
