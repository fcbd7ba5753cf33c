// The tokenizer stored in GGUF metadata (tokenizer.ggml.* and tokenizer.chat_template) as plain
// data, checked for consistency. Building a tokenizer from it is kvlab_tokenizer's job
// (make_bpe_tokenizer); nothing here tokenizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/gguf/gguf_parse.h"

namespace kv {

struct GgufTokenizerData {
    std::string model;                 // tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece), ...
    std::string pre;                   // tokenizer.ggml.pre: pre-tokenizer name ("smollm", "llama-bpe", ...); "" if absent
    std::vector<std::string> tokens;   // id -> token text
    std::vector<float> scores;         // empty, or one per token
    std::vector<int32_t> token_types;  // empty, or one per token: 1 normal, 2 unknown, 3 control,
                                       // 4 user defined, 5 unused, 6 byte
    std::vector<std::string> merges;   // BPE merges "left right", highest priority first
    int64_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1 = absent
    std::optional<bool> add_bos_token, add_eos_token;             // absent = tokenizer's default
    std::string chat_template;         // Jinja template; "" if absent

    bool empty() const { return tokens.empty(); }
};

// Reads the tokenizer keys of `f`. A file without tokenizer.ggml.tokens yields empty data. Throws
// kv::Error naming the file and key when a key has the wrong type, scores/token_type lengths
// differ from the token count, or a special token id is outside [0, tokens).
GgufTokenizerData gguf_tokenizer_data(const GgufFile& f);

}  // namespace kv
