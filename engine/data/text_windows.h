// Real text for perplexity: files tokenized once and cut into windows of seq_length tokens
// (next-token loss over every position but the first). Missing files get a clear message.
#pragma once

#include <string>
#include <vector>

#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct TextWindows {
    std::vector<std::vector<int32_t>> windows;  // each seq_length tokens
    int64_t total_tokens = 0;                   // tokens in all files
    bool bos = false;                           // a BOS token opens the text (the tokenizer adds one)
};

// Up to max_windows non-overlapping windows from the start of the concatenated files
// (a BOS first only when the tokenizer adds one itself: GGUF tokenizer.ggml.add_bos_token, HF
// add_bos_token or the format's default, as generate and llama.cpp's perplexity do). Throws kv::Error naming a missing/unreadable file
// or text too short for one window.
TextWindows make_text_windows(const std::vector<std::string>& files, const Tokenizer& tok, int64_t seq_length, int64_t max_windows);

}  // namespace kv
