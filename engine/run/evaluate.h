// Evaluation runs (modes eval_long and infer): build the data (synthetic tasks, text windows),
// run every sample through the chunked long-context driver with the configured cache policy,
// and summarise loss / accuracy / perplexity, tokens per second, KV bytes and peak memory.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "engine/driver/fidelity.h"
#include "engine/kv/layer_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "engine/telemetry/run_phase.h"
#include "run_config.h"

namespace kv {

struct EvalSampleResult {
    int64_t index = 0;
    double loss = 0;        // mean cross-entropy of the sample
    int32_t prediction = -1;
    int32_t label = -1;
    bool correct = false;
    int64_t tokens = 0;
    double seconds = 0;
    std::string description;
    double copy_token_accuracy = -1;  // repeat: copied tokens / scored tokens; -1 otherwise
    double copy_prefix = -1;          // repeat: tokens copied before the first error / scored tokens
    // --data.questions > 1: the context (sample) this question was asked of and which question
    // it is (0-based); a result per question, index counting every question of the run.
    int64_t context = -1, question = -1;
    // compress-then-ask: the greedy answer generated from the compressed cache after the
    // question (until an end-of-generation token, at most the answer's tokens + 8), its length
    // in tokens and its RULER score (ruler_text_score); -1 otherwise.
    int64_t generated_tokens = -1;
    double generated_score = -1;
};

struct EvalSummary {
    std::string cache_name;
    std::vector<EvalSampleResult> samples;
    double mean_loss = 0;
    double accuracy = -1;     // classification tasks, exact answers over every result (question); -1 otherwise
    double perplexity = -1;   // text; -1 otherwise
    // repeat: accuracy is the fraction of samples copied exactly; these are means over samples
    // (RULER tasks: accuracy = exact answers, copy_token_accuracy = answer tokens right)
    double copy_token_accuracy = -1, copy_prefix = -1;
    int64_t tokens = 0;         // tokens fed through the model (all samples)
    int64_t scored_tokens = 0;  // of those, positions whose loss counts (targets, or 1 per sample for a class head)
    double seconds = 0;       // wall time of the evaluation, instrumentation included
    // Of those, the time spent measuring the run rather than running it (--fidelity: the
    // comparison with full attention, the dense reference pass, the KL heads; 0 without).
    double instrumentation_seconds = 0;  // the instrumentation phases' seconds (run_phase.h)
    PhaseSeconds phase_seconds{};         // exclusive seconds per phase over the samples
    double tokens_per_s = 0;  // the run's own speed: tokens / the policy passes' seconds
    double tokens_per_s_with_instrumentation = 0;  // tokens / seconds
    size_t kv_bytes = 0;      // all layers' K/V storage at the end of the last sample
    // Of it: the bytes of the slots kept (logical) and what the buffers hold for them (physical:
    // whole paged blocks, whole per-head pools; without the shared dequantized working buffer).
    size_t kv_logical_bytes = 0, kv_physical_bytes = 0;
    // Layers whose sliding window the cache keeps by rule (a ring, no policy), and their slots.
    std::vector<int> windowed_layers;
    std::vector<int64_t> windowed_slots;
    size_t kv_bytes_windowed = 0;  // of kv_bytes, the windowed layers' storage
    std::vector<std::string> layer_kinds;  // each layer's cache in words (engine/core/layer_kind.h)
    double kv_bits_per_element = 0;
    int64_t chunks_per_sample = 0;
    // --protocol compress-then-ask: the last sample's context tokens and the slots its
    // compression kept per layer (per head where the policy keeps per head); 0 / empty otherwise.
    int64_t context_tokens = 0;
    std::vector<int64_t> kept_slots;
    // The same, summed over each layer's (b, g) rows (a score threshold keeps a count per head).
    std::vector<int64_t> kept_total_slots;
    // The same per (b, g) row of each layer (a score threshold's count per head).
    std::vector<std::vector<int64_t>> kept_row_slots;
    // compress-then-ask: contexts run and compressed (loaded ones not counted), questions asked
    // of each, and with several the exact-answer accuracy of question j over the contexts.
    int64_t contexts_compressed = 0, questions_per_context = 0;
    std::vector<double> question_accuracy;
    // The same per question (per turn under --data.turns multi-turn): the mean RULER score of its
    // greedy answers over the contexts.
    std::vector<double> question_score;
    // --kv_cache.decode_ratio: tokens decoded under the decoding budget (every question and
    // answer token, one per forward) and the slots per row each layer held after the last one.
    int64_t decoded_tokens = 0;
    // compress-then-ask: means over the questions of the greedy answer's length and RULER score
    // (EvalSampleResult::generated_*); -1 otherwise.
    double generated_tokens = -1, generated_score = -1;
    std::vector<int64_t> decode_final_slots;
    int text_bos = -1;  // text: 1 if a BOS token opened the text, 0 if the tokenizer adds none; -1 other data
    std::vector<DeviceMemoryStats> memory;  // peaks by category during the run
    // --fidelity: per-layer means over every (sample, chunk), and the means over all steps
    // (-1 without fidelity).
    std::vector<FidelityLayerSummary> fidelity_layers;
    double fidelity_attn_rel_error = -1, fidelity_kept_mass = -1;
    // --fidelity_oracle: the oracle's kept mass and the efficiency kept / oracle, means over
    // every (sample, layer, chunk) step (-1 without the oracle).
    double fidelity_oracle_mass = -1, fidelity_efficiency = -1;
    // --fidelity: mean over every (sample, chunk) of the next-token KL against the dense
    // reference stream (DenseReference), -1 without fidelity.
    double fidelity_next_token_kl = -1;
};

struct EvalCallbacks {
    // units done / total (a unit = one layer of one chunk of one sample).
    std::function<void(int64_t done, int64_t total, const std::string& what)> progress;
    std::function<void(const EvalSampleResult&)> on_sample;
    // Set: each sample's input ids and per-position loss (HeadResult::token_loss: NaN where
    // nothing was scored), before on_sample. The losses are the head's row losses, no extra work.
    std::function<void(const EvalSampleResult&, const std::vector<int32_t>& ids, const std::vector<float>& token_loss)>
        on_sample_tokens;
    LayerStepHook on_layer_step;  // per (layer, chunk): plans, positions, weights
    // --fidelity: each sample's (layer, chunk) steps, after the sample ran.
    std::function<void(int64_t sample, const std::vector<FidelityStep>&)> on_fidelity;
    // --fidelity: each sample's per-chunk next-token KL, after the sample ran.
    std::function<void(int64_t sample, const std::vector<FidelityKLStep>&)> on_fidelity_kl;
    const std::atomic<bool>* cancel = nullptr;
    // RULER tasks: the model's chat template around a user message (engine/generate's
    // chat_prompt; generate sits above run). Unset: prompts end with "Answer:".
    std::function<std::string(const std::string& user)> chat_frame;
    // With chat_frame: what closes the assistant's turn (chat_turn_end), so a conversation's
    // later questions (--data.turns multi-turn) open user turns of their own.
    std::function<std::string()> chat_turn_end;
};

// Runs the evaluation; memory is tracked by the calling thread's current MemoryTracker.
EvalSummary run_eval(const RunConfig& cfg, LoadedModel& lm, const EvalCallbacks& cb = {});

}  // namespace kv
