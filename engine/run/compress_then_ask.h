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
#include "engine/model/model_loader.h"
#include "engine/model/transformer.h"
#include "run_config.h"

namespace kv {

// The cache configuration and chunk plan of a context of T tokens: every layer T slots (the
// policy never evicts), the first chunk the run's prefill_length or else its chunk size, so
// the policy sees the attention of every later chunk's queries.
KVCacheConfig context_cache_config(const KVCacheConfig& run_cache, int64_t T);
ChunkPlan context_chunk_plan(const RunConfig& cfg, const KVCacheConfig& context_cache, const ModelConfig& mc, int64_t T);

// Runs `context` (positions 0..T-1) through a fresh cache of `context_cache` and compresses it
// to `keep` slots per row, or with `threshold` set to the slots scoring at least that and the
// last `threshold_window` positions (compress_cache_threshold; keep unused). The model's context
// width is set to `width` (the whole sample, so the questions' RoPE matches the context's).
CompressedCache compress_context(Transformer& model, const KVCacheConfig& context_cache, const ChunkPlan& plan,
                                 const std::vector<int32_t>& context, int64_t keep, int64_t width, const TextCodec* codec = nullptr,
                                 const DriverCallbacks& cb = {}, std::optional<double> threshold = std::nullopt,
                                 int64_t threshold_window = 0);

// One question answered from the compressed cache (rewound first): ids at positions
// cache.context_length().., targets[t] the token scored after ids[t] (-100: none). With a
// decoding budget (CompressedCache::set_decode_ratio, set_decode_threshold) the tokens go one per
// forward, as decoding feeds them, so the budget holds after each.
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

// One question's answer in a conversation: the question teacher-forced after the transcript
// (its scores; `asked` covers transcript + question, token_loss NaN over the transcript), and
// the greedy answer generated after the transcript and the question's prompt (its ids up to and
// including the last one before the first scored target).
struct TurnAnswer {
    AskResult asked;
    std::vector<int32_t> transcript;  // the conversation before this question (empty: multi-request)
    std::vector<int32_t> prompt;      // the question's ids before its answer
    std::vector<int32_t> answer;      // the greedy answer (stop id not included)
    std::vector<int64_t> slots;       // per layer, the slots per row after the teacher-forced pass
};

// The questions of one compressed context, asked as `turns` says (protocol.h): multi-request,
// each from the compressed state alone; multi-turn, SCBench's conversation, where question j
// comes after questions 0..j-1's prompts and the model's own greedy answers to them. Each turn
// starts from the rewound compressed state and feeds the transcript again (one token per forward
// under a decoding budget, as the live conversation fed it, so the budget acts on the earlier
// turns too); the context itself is never run again. A greedy answer stops at one of stop_ids or
// after its expected length (the targets' count) + slack tokens.
std::vector<TurnAnswer> ask_questions(Transformer& model, CompressedCache& cache, const std::vector<Question>& questions, QuestionTurns turns,
                                      int64_t slack, const std::vector<int32_t>& stop_ids, bool keep_logits = false);

// Why `cfg`'s cache cannot run compress-then-ask, or "" when it can: the configuration's
// problems (run_config_problems), else the refusal of a trial compression of a context of the
// run's data.seq_length tokens (half kept, or cfg's threshold) on `lm`, the run's model (what only the run finds:
// per-head pools, lengths decided during the sequence, a calibration file for another model).
// For choosing a sweep's caches before anything runs.
std::string compression_refusal(const RunConfig& cfg, LoadedModel& lm);

// The RoPE width the questions of a context of `context_tokens` need under `turns`: the longest
// question (multi-request) or the whole conversation (multi-turn), each answer allowed its
// expected length + slack.
int64_t questions_width(int64_t context_tokens, const std::vector<Question>& questions, QuestionTurns turns, int64_t slack);

}  // namespace kv
