// Filler for the synthetic long-context tasks (repeat, RULER): n tokens of sentences drawn at
// random from a task's own list, 64 sentences per encode, each after `sep`. Deterministic for
// a seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

std::vector<int32_t> filler_tokens(std::mt19937_64& rng, const Tokenizer& tok, int64_t n, const std::vector<std::string>& sentences,
                                   const std::string& sep);

}  // namespace kv
