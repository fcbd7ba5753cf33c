// The compress-then-ask protocol (protocol.h) for one sample: run the context through a cache
// that holds all of it (chunked as the run's chunk size says, the policy scoring, nothing
// evicted), compress it once (engine/kv/compressed_cache.h), then answer each question from the
// compressed cache, teacher-forced: every question starts from the same compressed state.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/driver/long_context.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/transformer.h"
#include "run_config.h"

namespace kv {

// The cache configuration and chunk plan of a context of T tokens: every layer T slots (the
// policy never evicts), the first chunk the run's prefill_length or else its chunk size, so
// the policy sees the attention of every later chunk's queries.
KVCacheConfig context_cache_config(const KVCacheConfig& run_cache, int64_t T);
ChunkPlan context_chunk_plan(const RunConfig& cfg, const KVCacheConfig& context_cache, const ModelConfig& mc, int64_t T);

// Runs `context` (positions 0..T-1) through a fresh cache of `context_cache` and compresses it
// to `keep` slots per row, or with `threshold` set to the slots scoring at least that
// (compress_cache_threshold; keep unused). The model's context width is set to `width` (the whole sample, so
// the questions' RoPE matches the context's).
CompressedCache compress_context(Transformer& model, const KVCacheConfig& context_cache, const ChunkPlan& plan,
                                 const std::vector<int32_t>& context, int64_t keep, int64_t width, const TextCodec* codec = nullptr,
                                 const DriverCallbacks& cb = {}, std::optional<double> threshold = std::nullopt);

// One question answered from the compressed cache (rewound first): ids at positions
// cache.context_length().., targets[t] the token scored after ids[t] (-100: none). With a
// decoding budget (CompressedCache::set_decode_ratio) the tokens go one per forward, as decoding
// feeds them, so the budget holds after each.
struct AskResult {
    double loss_sum = 0;
    int64_t count = 0;
    std::vector<int32_t> argmax;  // per scored position, in order
    std::vector<float> token_loss;  // (ids) cross-entropy of targets[t], NaN where none is scored
    std::vector<float> logits;    // (ids, V) f32, the question's logits (bit-identity checks)
};
AskResult ask_compressed(Transformer& model, CompressedCache& cache, const std::vector<int32_t>& ids, const std::vector<int32_t>& targets,
                         bool keep_logits = false);

// Greedy generation from the compressed cache (rewound first): the prompt at positions
// cache.context_length().., then the argmax of the last logits fed back one token per forward,
// until one of stop_ids or max_new tokens (under a decoding budget the prompt too goes one token
// per forward). Returns the generated ids, the stop id not included.
std::vector<int32_t> generate_compressed(Transformer& model, CompressedCache& cache, const std::vector<int32_t>& prompt, int64_t max_new,
                                         const std::vector<int32_t>& stop_ids);

// Several questions of one compressed context (SCBench's multi-request), answered in turn:
// each from the compressed state (ask_compressed rewinds), so no question sees another.
struct Question {
    std::vector<int32_t> ids, targets;  // as ask_compressed's
};
std::vector<AskResult> ask_in_turn(Transformer& model, CompressedCache& cache, const std::vector<Question>& questions, bool keep_logits = false);

}  // namespace kv
