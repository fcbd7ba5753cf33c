// The repeat task (context reconstruction, the signal KVzip scores with): a passage of random
// words, filler text, then the same passage again. A model with the first copy in its cache
// copies the second (induction heads do this even in small models); a policy that evicted it
// cannot. Scored on the second copy after a short cue: the loss of its tokens, and whether a
// greedy continuation reproduces it exactly. Deterministic from the seed and sample index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct RepeatSpec {
    int64_t seq_length = 2048;     // total tokens
    int64_t passage_length = 64;   // tokens per copy of the passage
    int64_t distance = -1;         // filler tokens between the copies (-1: all the rest)
    uint64_t seed = 1234;
};

// Tokens of the second copy given before scoring starts, so the model knows which passage to copy.
constexpr int64_t kRepeatCue = 4;

struct RepeatSample {
    std::vector<int32_t> ids;      // [filler] passage filler passage
    int64_t first_copy = 0;        // position of the first copy's first token
    int64_t second_copy = 0;       // position of the second copy's first token
    int64_t passage_length = 0;
    std::string description;       // e.g. "repeat 64 tokens at distance 1900"
    // Positions t whose next token ids[t + 1] is scored: second_copy + kRepeatCue - 1 ..
    // second_copy + passage_length - 2.
    int64_t first_scored_input() const { return second_copy + kRepeatCue - 1; }
    int64_t scored_tokens() const { return passage_length - kRepeatCue; }
};

// Throws kv::Error naming --data.* when the lengths do not fit.
RepeatSample make_repeat_sample(const RepeatSpec& spec, int64_t index, const Tokenizer& tok);

// How well a continuation copies the expected tokens.
struct CopyScore {
    bool exact = false;          // every token equal (a greedy decode reproduces the passage)
    int64_t prefix = 0;          // tokens equal before the first difference
    int64_t matches = 0;         // equal tokens at equal positions
    int64_t length = 0;          // expected tokens
    double token_accuracy() const { return length ? double(matches) / double(length) : 0.0; }
    double prefix_fraction() const { return length ? double(prefix) / double(length) : 0.0; }
};

// `predicted` shorter than `expected` counts the missing tokens as wrong.
CopyScore score_copy(const std::vector<int32_t>& expected, const std::vector<int32_t>& predicted);

}  // namespace kv
