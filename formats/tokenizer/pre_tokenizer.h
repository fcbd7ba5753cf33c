// Pre-tokenizers (Hugging Face `pre_tokenizer`, llama.cpp `tokenizer.ggml.pre`): cut a normalized
// segment into words before BPE. Steps: regex Split with a delimiter behaviour, ByteLevel (optional
// GPT-2 regex, then the byte->unicode map) and Metaspace. Output pieces are in the model's
// alphabet (byte-mapped after ByteLevel). Must not look up vocabularies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kv {

class Regex;

// The split patterns of the BPE families we load, exactly as their tokenizer.json files spell them.
namespace pretok_pattern {
// GPT-2 (ByteLevel use_regex), SmolLM/StarCoder after a Digits split.
inline constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Qwen2 / Qwen2.5 / Qwen3: single digits.
inline constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Llama 3: digits in groups of up to three.
inline constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}  // namespace pretok_pattern

// What happens to the matched text (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t { REMOVED, ISOLATED, MERGED_WITH_PREVIOUS, MERGED_WITH_NEXT, CONTIGUOUS };

enum class PreTokKind : uint8_t { SPLIT, BYTE_LEVEL, METASPACE };

// Metaspace: when to put the replacement character in front of a piece.
enum class PrependScheme : uint8_t { ALWAYS, FIRST, NEVER };

struct PreTokStep {
    PreTokKind kind = PreTokKind::SPLIT;
    std::shared_ptr<const Regex> regex;  // SPLIT; BYTE_LEVEL with use_regex (null: no split)
    SplitBehavior behavior = SplitBehavior::ISOLATED;
    bool invert = false;            // SPLIT: the matches are the kept words, the gaps the delimiters
    bool add_prefix_space = false;  // BYTE_LEVEL: prepend ' ' to a piece not starting with one
    std::string replacement = "\xE2\x96\x81";  // METASPACE: U+2581 "▁"
    PrependScheme prepend = PrependScheme::ALWAYS;
    bool split = true;  // METASPACE: split before each replacement character
};

class PreTokenizer {
   public:
    void add(PreTokStep step) { steps_.push_back(std::move(step)); }
    bool empty() const { return steps_.empty(); }
    bool has_byte_level() const;

    // Splits one normalized segment (text between added tokens) into words, appended to `out`.
    // `at_text_start`: the segment starts the input (Metaspace prepend_scheme "first").
    void split(std::string_view text, bool at_text_start, std::vector<std::string>& out) const;

   private:
    std::vector<PreTokStep> steps_;
};

// Splits `text` around the matches of `re` according to `behavior` (empty pieces dropped).
void split_by_regex(std::string_view text, const Regex& re, SplitBehavior behavior, bool invert,
                    std::vector<std::string>& out);

}  // namespace kv
