// The tokenizer of the built-in presets: one token per byte (ids 0..255) plus <bos> <eos>
// <pad>. Lossless for any text, needs no files, and makes sequence lengths easy to reason
// about (a 4096-token sample is 4096 bytes).
#pragma once

#include <memory>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

std::unique_ptr<Tokenizer> make_byte_tokenizer();

}  // namespace kv
