// A compiled PCRE2 pattern (UTF + UCP, JIT when available) for the pre-tokenizer splits:
// \p{L}, \p{N}, lookaheads and (?i:...) as Hugging Face and llama.cpp patterns use them.
// Compiled once per tokenizer and shared read-only between threads; it must not keep match
// state between calls. Invalid UTF-8 in the subject never matches (it falls into the gaps).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace kv {

class Regex {
   public:
    // Throws kv::Error naming the pattern, PCRE2's message and the offset of the problem.
    explicit Regex(std::string pattern);
    ~Regex();
    Regex(const Regex&) = delete;
    Regex& operator=(const Regex&) = delete;

    // Appends every non-overlapping, non-empty match in `text` as [begin, end) byte offsets,
    // leftmost first. Throws kv::Error if PCRE2 gives up (match limit).
    void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

    const std::string& pattern() const { return pattern_; }

    // Escapes every character that is special in PCRE2 so `literal` matches itself.
    static std::string escape(std::string_view literal);

   private:
    std::string pattern_;
    pcre2_real_code_8* code_ = nullptr;
};

// A compiled regex shared by every tokenizer that uses the same pattern (compiled once per
// process while any user holds it). Throws like the Regex constructor.
std::shared_ptr<const Regex> shared_regex(const std::string& pattern);

}  // namespace kv
