// The long-context forward driver (reference §7.2): reset the caches, then loop
// cell -> layer -> chunk so quantized buffers are (de)quantized once per (cell, layer) and the
// live activations stay at one cell; feed the head model chunk by chunk. Cancellable between
// chunks; reports progress in (layer, chunk) steps.
#pragma once

#include <atomic>
#include <functional>

#include "chunk_plan.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/transformer.h"
#include "head_model.h"

namespace kv {

struct DriverCallbacks {
    // After every (layer, chunk) step: steps done, steps total.
    std::function<void(int64_t done, int64_t total)> progress;
    // Hook at the start of each layer of each cell with its input (gradient checkpoints).
    std::function<void(int layer, size_t cell, const std::vector<Tensor>& inputs)> layer_input;
    // Hook with each cell's final-layer outputs (before the final norm), chunk by chunk.
    std::function<void(size_t cell, const std::vector<Tensor>& outputs)> final_output;
    const std::atomic<bool>* cancel = nullptr;
    // The attention the blocks call instead of `cache` itself: a wrapper around the same cache
    // that observes it (FidelityAttention). nullptr = the cache.
    CacheAttention* attention = nullptr;
    // Forced plans (the gradient pipeline): per layer, the plans every chunk commits instead of
    // the policy's (ChunkInput::replay). nullptr = the policies plan.
    const std::vector<std::vector<SlotPlan>>* replay = nullptr;
    // The live token progress (trace::progress) of a run of several calls (eval_long's samples):
    // the tokens of the calls before this one and the run's total, so done stays below total
    // until the last call ends. Total 0: this call is the whole run. (Its (layer, chunk) steps
    // stay per call: the cell-grid view reads them per sample.)
    int64_t run_tokens_before = 0, run_tokens_total = 0;
    // Work the caller does after this call's last step and counts in the same sample's token
    // progress (fidelity's dense reference and KL heads), in (layer, chunk) step units: the
    // tokens reach the sample's end only when that work is done too.
    int64_t units_after = 0;
};

// Thrown when the cancel flag is seen (the run stops within one chunk).
struct Cancelled : Error {
    Cancelled() : Error("cancelled") {}
};

// Runs ids (B, T) through the model with `cache`; the head accumulates into `out`.
// The model's context width is set to T (YaRN) unless keep_context_width.
void long_context_forward(Transformer& model, KVCache& cache, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head,
                          HeadResult& out, const DriverCallbacks& cb = {}, bool keep_context_width = false);

// The cell factor 2 G D / E of a model (reference §7.1); 0 (one chunk per cell) when a layer
// reads another layer's K/V (a shared layer must see its source as of the same chunk).
double cell_factor(const ModelConfig& cfg);

}  // namespace kv
