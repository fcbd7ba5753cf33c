// Evaluation protocols: how a sample meets the cache. "chunked" is keys_values' (the whole
// sample streamed in chunks through a fixed number of slots, evicting as it goes; the
// default); "compress-then-ask" is kvpress's (the context run without eviction, compressed
// once to a ratio of its length or a token count, then each question answered from the
// compressed cache, never evicted). The table names each protocol once, for the option, the
// stored configuration and the help texts.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kv {

enum class Protocol { CHUNKED, COMPRESS_THEN_ASK };

struct ProtocolInfo {
    Protocol id;
    const char* name;
    const char* summary;
};

const std::vector<ProtocolInfo>& protocol_registry();
std::vector<std::string> protocol_names();
// Throws kv::Error naming --protocol and the known names.
Protocol parse_protocol(const std::string& name);

// How the questions of one compressed context are asked (SCBench's two shared-context modes):
// multi-request, each from the compressed context alone; multi-turn, a conversation, each after
// the earlier questions and the model's greedy answers to them (--data.turns).
enum class QuestionTurns { MULTI_REQUEST, MULTI_TURN };

struct QuestionTurnsInfo {
    QuestionTurns id;
    const char* name;
    const char* summary;
};

const std::vector<QuestionTurnsInfo>& question_turns_registry();
std::vector<std::string> question_turns_names();
// Throws kv::Error naming --data.turns and the known names.
QuestionTurns parse_question_turns(const std::string& name);

// The protocol's options as a run records them (RunConfig::protocol).
struct ProtocolConfig {
    std::string name = "chunked";
    // compress-then-ask: the fraction of the context's T tokens dropped (floor((1 - r) T)
    // slots kept per layer, or per head for policies with per-head slots), or, when
    // keep_tokens > 0, that many slots kept instead.
    double compression_ratio = 0.0;
    int64_t keep_tokens = 0;
    // compress-then-ask: the question is part of the context the policy scores and compresses
    // (kvpress's query_aware); only the last prompt token before the answer stays outside.
    bool query_aware = false;
    // compress-then-ask: the threshold budget, a number as text ("" = none): keep the context
    // slots whose policy score is >= it instead of a ratio or count (the kept count is then an
    // outcome, recorded per layer).
    std::string score_threshold;
    // compress-then-ask with score_threshold: the last this many context positions are kept
    // whatever their score (DMS's protected recent window; kvpress's DMSPress protects 128).
    int64_t threshold_window = 0;
    // compress-then-ask with score_threshold: evict below the threshold while the question and
    // answer are decoded too (context slots leaving the window; CompressedCache::set_decode_threshold).
    bool threshold_decode = false;
    // compress-then-ask: the decoding-time budget, a ratio of everything seen so far: while the
    // question and answer are fed (one token per forward) each layer keeps floor((1 - r) seen)
    // slots, evicting context slots in the policy's order (CompressedCache::set_decode_ratio).
    // The compression uses the same ratio when compression_ratio is not set.
    double decode_ratio = 0.0;
    // compress-then-ask with decode_ratio: every this many decoded tokens each context slot's
    // score grows by the attention the tokens decoded since paid it
    // (CompressedCache::set_decode_rescore); 0 = never, the compression's scores rank the slots
    // for the whole decode.
    int64_t decode_rescore_every = 0;
    // compress-then-ask: save each sample's compressed cache to this file (sample 0; sample i > 0
    // to PATH.i), or load it from there instead of running and compressing the context.
    std::string save_path, load_path;
};

// The file of sample `index` under a --kv_cache.save / load path: the path itself for sample 0,
// "PATH.index" after it.
std::string compressed_cache_path(const std::string& path, int64_t index);

// Slots a compressed context of T tokens keeps: keep_tokens if set (at most T), else
// floor((1 - r) T) as kvpress computes it (int(T * (1 - r))). Throws kv::Error when it is 0.
int64_t compress_keep(const ProtocolConfig& p, int64_t T);

// The threshold of --kv_cache.score_threshold, none when it is empty. Throws kv::Error naming
// the option when it is not a finite number.
std::optional<double> score_threshold(const ProtocolConfig& p);

}  // namespace kv
