// Added tokens (Hugging Face `added_tokens`, GGUF control/user-defined tokens): strings such as
// "<|im_end|>" that are cut out of the text before normalization and pre-tokenization and map
// straight to one id. Matching is leftmost-longest, with the lstrip/rstrip/single_word flags.
// Must not normalize or tokenize the text between matches; the pipeline does that.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kv {

struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false;      // a control token: skipped by decode(skip_special_tokens)
    bool lstrip = false;       // the match swallows whitespace on its left
    bool rstrip = false;       // ... and on its right
    bool single_word = false;  // only matches when not inside a word
    bool normalized = false;   // matched on normalized text (else on the raw input)
};

// A piece of input text: either a run of ordinary text [begin, end) or one added token.
struct TextSegment {
    size_t begin = 0, end = 0;
    int32_t id = -1;  // >= 0: an added token
};

class AddedTokenMatcher {
   public:
    // `tokens` must outlive the matcher. Only entries accepted by `use` are matched.
    void build(const std::vector<AddedToken>& tokens, const std::vector<bool>& use);
    bool empty() const { return count_ == 0; }

    // Splits `text` into text runs and added tokens, appended to `out` with offsets into `text`.
    // `parse_special` false: special tokens are ordinary text (only non-special ones match).
    void split(std::string_view text, bool parse_special, std::vector<TextSegment>& out) const;

   private:
    const std::vector<AddedToken>* tokens_ = nullptr;
    // Candidate token indices per first byte, longest content first (leftmost-longest match).
    std::array<std::vector<uint32_t>, 256> by_first_byte_;
    size_t count_ = 0;
};

}  // namespace kv
