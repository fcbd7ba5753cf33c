// The protocol table (see protocol.h).
#include "protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/join.h"

namespace kv {

const std::vector<ProtocolInfo>& protocol_registry() {
    static const std::vector<ProtocolInfo> t = {
        {Protocol::CHUNKED, "chunked", "keys_values': the sample streamed in chunks through cache_length slots, evicting as it goes"},
        {Protocol::COMPRESS_THEN_ASK, "compress-then-ask",
         "kvpress': the context run without eviction, compressed once (kv_cache.compression_ratio or keep_tokens), then the "
         "question answered from the compressed cache"},
    };
    return t;
}

std::vector<std::string> protocol_names() {
    std::vector<std::string> n;
    for (const ProtocolInfo& p : protocol_registry()) n.push_back(p.name);
    return n;
}

Protocol parse_protocol(const std::string& name) {
    for (const ProtocolInfo& p : protocol_registry())
        if (name == p.name) return p.id;
    throw Error(str("--protocol: '", name, "' is not a protocol; expected one of: ", join(protocol_names(), ", ")));
}

const std::vector<QuestionTurnsInfo>& question_turns_registry() {
    static const std::vector<QuestionTurnsInfo> t = {
        {QuestionTurns::MULTI_REQUEST, "multi-request", "each question answered from the compressed context alone"},
        {QuestionTurns::MULTI_TURN, "multi-turn",
         "a conversation: each question after the earlier questions and the model's greedy answers to them"},
    };
    return t;
}

std::vector<std::string> question_turns_names() {
    std::vector<std::string> n;
    for (const QuestionTurnsInfo& t : question_turns_registry()) n.push_back(t.name);
    return n;
}

QuestionTurns parse_question_turns(const std::string& name) {
    for (const QuestionTurnsInfo& t : question_turns_registry())
        if (name == t.name) return t.id;
    throw Error(str("--data.turns: '", name, "' is not a way of asking; expected one of: ", join(question_turns_names(), ", ")));
}

std::string compressed_cache_path(const std::string& path, int64_t index) {
    return index == 0 ? path : str(path, ".", index);
}

int64_t compress_keep(const ProtocolConfig& p, int64_t T) {
    const double r = p.compression_ratio > 0.0 ? p.compression_ratio : p.decode_ratio;
    const int64_t keep = p.keep_tokens > 0 ? std::min(p.keep_tokens, T) : int64_t(double(T) * (1.0 - r));
    if (keep < 1)
        throw Error(str("--kv_cache.compression_ratio: ", r, " keeps no slot of a context of ", T,
                        " tokens; expected a ratio below ", 1.0 - 1.0 / double(std::max<int64_t>(T, 1)), " or --kv_cache.keep_tokens"));
    return keep;
}

std::optional<double> score_threshold(const ProtocolConfig& p) {
    if (p.score_threshold.empty()) return std::nullopt;
    char* end = nullptr;
    const double t = std::strtod(p.score_threshold.c_str(), &end);
    if (end == p.score_threshold.c_str() || *end != '\0' || !std::isfinite(t))
        throw Error(str("--kv_cache.score_threshold: '", p.score_threshold, "' is not a number; expected a finite score (empty: no threshold)"));
    return t;
}

}  // namespace kv
