// BOS/EOS/PAD ids for Hugging Face folders: tokenizer.json does not name them, so they come from
// tokenizer_config.json (token strings, add_bos_token/add_eos_token), generation_config.json and
// config.json (ids), in that order of precedence, with name-based fallbacks for bare files.
// Must not build tokenizers; it only reads the side files and resolves ids.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kv {

struct SideConfig {
    // tokenizer_config.json: nullopt = key absent; "" with *_null = key present and null.
    std::optional<std::string> bos_token, eos_token, pad_token;
    bool bos_null = false, eos_null = false, pad_null = false;
    std::optional<bool> add_bos_token, add_eos_token;
    // generation_config.json, then config.json (ids as written; eos may be a list).
    std::vector<int32_t> bos_ids, eos_ids, pad_ids;
    bool any_file = false;  // at least one side file was found
};

// Reads the side files in `dir` (missing files are fine). Throws kv::Error naming the file when
// one exists but is not valid JSON.
SideConfig read_side_config(const std::string& dir);

struct SpecialIds {
    int32_t bos = -1, pad = -1;
    std::vector<int32_t> eos;  // primary first, no duplicates
};

// Resolves ids. `lookup` maps token text to an id (-1 if absent). `fallback_bos` (e.g. the first
// id the post-processor adds) is used when no file names a BOS token. With no EOS from any file,
// well-known end-of-text/turn tokens present in the vocabulary are used.
SpecialIds resolve_special_ids(const SideConfig& cfg, const std::function<int32_t(const std::string&)>& lookup,
                               int32_t vocab_size, int32_t fallback_bos);

// Token texts that end a generation in the families we load (used when no file names an EOS).
inline constexpr std::array<std::string_view, 8> kEndOfGenerationNames = {
    "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>", "</s>", "<|end|>", "<end_of_turn>", "<|eom_id|>"};

}  // namespace kv
