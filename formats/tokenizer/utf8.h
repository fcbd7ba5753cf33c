// UTF-8 helpers shared by the tokenizer stages: strict decoding (no overlongs, no surrogates),
// encoding, and detection of an incomplete sequence at the end of a buffer (streaming decode).
// Pure byte functions: they must not allocate beyond their outputs nor know about tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kv::utf8 {

// Decodes the code point starting at s[i]. Returns its byte length (1..4) and stores it in *cp,
// or returns 0 when s[i] does not start a valid, complete sequence (*cp is then undefined).
int decode(std::string_view s, size_t i, uint32_t* cp);

// Appends the UTF-8 encoding of cp (cp must be <= 0x10FFFF and not a surrogate).
void append(std::string& out, uint32_t cp);

// True when the whole buffer is valid UTF-8.
bool is_valid(std::string_view s);

// Number of trailing bytes (0..3) that form the valid beginning of a sequence that is not
// finished yet: more bytes could complete it. Used to hold back output while streaming.
size_t incomplete_tail(std::string_view s);

// Length in bytes of the character at s[i]: the sequence length when valid, else 1 (an
// invalid byte stands alone). Never 0 while i < s.size().
inline size_t char_len_or_one(std::string_view s, size_t i) {
    uint32_t cp;
    int n = decode(s, i, &cp);
    return n > 0 ? size_t(n) : 1;
}

}  // namespace kv::utf8
