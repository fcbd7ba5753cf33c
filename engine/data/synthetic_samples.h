// Synthetic retrieval samples by index (calibrations, e.g. `kvlab calibrate duo`): `task`
// (passkey, recall, needle) prompts of seq_length tokens from synthetic.h, distinct per index.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

std::vector<std::vector<int32_t>> synthetic_samples(const std::string& task, int64_t seq_length, int64_t count, uint64_t seed,
                                                    const Tokenizer& tok);

}  // namespace kv
