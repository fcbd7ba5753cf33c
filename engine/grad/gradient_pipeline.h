// Gradients with the KV-cache policy in place (reference §9): phase 1 runs the ordinary
// chunked forward with the real policy and buffers, logs every slot decision and keeps
// layer-input checkpoints at row boundaries in host memory; phase 2 walks rows of layers from
// the top down and, within a row, cells from right to left. Each cell is recomputed from its
// checkpoints with replay caches (decisions replayed, full-precision K/V, chunk deltas instead
// of full buffers), then reversed with the fused scatter + SDPA backward. Memory stays flat in
// the sequence length: one cell's activations plus one KV buffer and its gradient per layer of
// the row, all through the tracked allocator so the timeline shows the cell "pyramids".
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/driver/chunk_plan.h"
#include "engine/driver/head_model.h"
#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/read_selection.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/transformer.h"
#include "head_backward.h"
#include "engine/model/model_grads.h"

namespace kv {

struct GradientOptions {
    int64_t layers_per_cell = 1;
    std::string layercp_qname = "default";  // layer-input checkpoints: default | q8 | q4
    std::string cachecp_qname;              // KV checkpoints at cell starts ("" = layercp_qname)
    // Take the layer checkpoints from a full-precision replay of the logged decisions rather
    // than from the phase-1 forward. Then the gradient is exactly that of the replayed
    // forward even when phase 1 ran on quantized buffers (keys_values accepts a mismatch).
    // AUTO: on when the cache buffers are quantized.
    enum class Exact : uint8_t { AUTO, ON, OFF } exact_checkpoints = Exact::AUTO;
    // With full-precision phase-1 buffers, take the KV states at cell starts from the phase-1
    // cache (host memory: layers x cells x one buffer) instead of replaying each row once
    // more in phase 2 (one forward pass less).
    bool kv_checkpoints_from_forward = true;
    int64_t max_logit_bytes = int64_t(256) << 20;  // head blocks: B x tokens x V logits at most
    Device host{};                                 // where checkpoints live
    // A policy that reads a selection of the cache (engine/kv/read_selection.h): gradient_step
    // sets it from the cache's config; null = every slot is read.
    std::shared_ptr<const ReadSelection> selection;
    // Called by phase 2 after each row of layers: the gradients of layers >= first_layer get
    // nothing more from this backward (data parallelism starts their all-reduce; issue 23).
    std::function<void(int first_layer)> layers_final;
};

struct GradientTargets {
    ModelGrads* model = nullptr;     // full fine-tuning (LoRA gradients go through the adapters)
    Tensor* class_weight = nullptr;  // seq_classification head gradients
    Tensor* class_bias = nullptr;
    Tensor* input_embedding_grad = nullptr;  // if set: (B, T, E) gradient w.r.t. the embeddings
};

struct GradientStats {
    double loss = 0;         // phase-1 loss (normalised as the reference, times the scale)
    double replay_loss = 0;  // the same loss from the checkpoints phase 2 differentiates
    HeadResult head;         // phase-1 head results (predictions for accuracy)
    int64_t rows = 0, cells = 0, chunks = 0;
    double phase1_seconds = 0, phase2_seconds = 0;
    std::vector<DeviceMemoryStats> phase1_memory, phase2_memory;  // peaks of each phase
    size_t layer_checkpoint_bytes = 0, kv_checkpoint_bytes = 0;
    std::vector<std::vector<SlotPlan>> plans;  // the replay log, per layer
};

// Rows of layers (reference §9.1): starts 0, lpc, 2 lpc, ...; a last row that would hold a
// single layer (when lpc > 1) joins the row before.
std::vector<std::pair<int, int>> gradient_rows(int num_layers, int64_t layers_per_cell);

// One gradient computation for ids (B, T): gradients accumulate (they are not zeroed) into the
// targets and the model's adapters; `loss_scale` multiplies the loss (micro-batch averaging).
// With `forced_plans` (one log per layer) phase 1 replays those decisions instead of asking
// the policy (fixtures, finite differences).
GradientStats gradient_step(Transformer& model, KVCache& cache, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head,
                            double loss_scale, const GradientOptions& opt, const GradientTargets& targets,
                            const DriverCallbacks& cb = {}, const std::vector<std::vector<SlotPlan>>* forced_plans = nullptr);

// Phase 2 alone for given decisions (one log per layer, e.g. from a fixture): checkpoints
// from the full-precision replay, then the same reverse pass as gradient_step.
GradientStats replay_gradient(const Transformer& model, const std::vector<std::vector<SlotPlan>>& plans,
                              const std::vector<int64_t>& cache_lengths, const Tensor& ids, const ChunkPlan& plan,
                              const HeadSpec& head, double loss_scale, const GradientOptions& opt,
                              const GradientTargets& targets, const DriverCallbacks& cb = {});

// The loss of the replayed forward (decisions from `plans`, full-precision K/V), normalised
// like gradient_step. What the gradient is the gradient of; finite differences call it.
double replay_loss(const Transformer& model, const std::vector<std::vector<SlotPlan>>& plans,
                   const std::vector<int64_t>& cache_lengths, const Tensor& ids, const ChunkPlan& plan, const HeadSpec& head,
                   double loss_scale, const Tensor* input_embeddings = nullptr,
                   std::shared_ptr<const ReadSelection> selection = nullptr);

}  // namespace kv
