// Text normalizers applied before pre-tokenization (Hugging Face `normalizer`): Unicode
// NFC/NFD/NFKC/NFKD and lowercase through ICU, plus the string edits SentencePiece-style BPE
// files use (Prepend, Replace, Strip). Sequences are flattened into one list of steps.
// Invalid UTF-8 bytes are never altered (byte-level BPE must round-trip any input).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kv {

class Regex;

enum class NormKind : uint8_t { NFC, NFD, NFKC, NFKD, LOWERCASE, PREPEND, REPLACE, STRIP };

struct NormStep {
    NormKind kind = NormKind::NFC;
    std::string text;                    // PREPEND: prefix; REPLACE: replacement content
    std::string literal;                 // REPLACE with a string pattern
    std::shared_ptr<const Regex> regex;  // REPLACE with a regex pattern
    bool strip_left = false, strip_right = false;  // STRIP
};

class Normalizer {
   public:
    void add(NormStep step) { steps_.push_back(std::move(step)); }
    bool empty() const { return steps_.empty(); }
    std::string apply(std::string_view text) const;

   private:
    std::vector<NormStep> steps_;
};

// One Unicode normalization form or lowercasing (kind NFC..LOWERCASE) over the valid UTF-8 runs
// of `text`; invalid bytes are copied through. Exposed for tests.
std::string unicode_transform(std::string_view text, NormKind kind);

}  // namespace kv
