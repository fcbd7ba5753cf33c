// Built-in synthetic long-context tasks, deterministic from a seed, as 4-way classification
// (the answer is one of choices A-D, read from the logits of the class tokens):
//   passkey  a number hidden in filler text ("the pass key is 58213")
//   recall   many key-value pairs; the value of one queried key (multi-key associative recall)
//   needle   a sentence inserted at a chosen depth of the haystack (needle in a haystack)
// Lengths are in tokens of the model's tokenizer (up to 128k and beyond).
#pragma once

#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct ClassSample {
    std::vector<int32_t> ids;        // the prompt, ending right before the answer token
    int32_t label = 0;               // index of the correct choice
    std::vector<std::string> choices;
    std::string description;         // e.g. "passkey 58213 at depth 0.42"
};

struct SyntheticSpec {
    std::string task = "passkey";    // passkey | recall | needle
    int64_t seq_length = 2048;       // target prompt length in tokens
    uint64_t seed = 1234;
    double depth = -1;               // needle/passkey depth in [0, 1]; < 0: random
    int64_t num_keys = 16;           // recall
};

// The class tokens ("A".."D", with a leading space when the tokenizer has such single tokens)
// and the matching prompt suffix.
struct ClassTokens {
    std::vector<int32_t> ids;
    std::string answer_prefix;  // text the prompt ends with ("Answer:" or "Answer: ")
};
ClassTokens class_tokens(const Tokenizer& tok);

// One sample; index i selects a distinct sample of the same task/seed.
ClassSample make_synthetic_sample(const SyntheticSpec& spec, int64_t index, const Tokenizer& tok);

}  // namespace kv
