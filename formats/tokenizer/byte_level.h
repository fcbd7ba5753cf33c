// The GPT-2 byte-level alphabet: every byte maps to one printable code point, so any byte string
// becomes a string of vocab characters and back. Bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to
// themselves; the other 68 bytes map to U+0100.. in byte order (space -> U+0120 "Ġ", \n -> "Ċ").
// Only the mapping lives here: no regexes, no vocabularies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kv {

// Code point a byte maps to.
uint32_t byte_level_codepoint(uint8_t b);

// Byte a code point stands for, or -1 when it is not in the byte-level alphabet.
int byte_level_byte(uint32_t cp);

// Bytes -> mapped characters (UTF-8), e.g. " hi\n" -> "ĠhiĊ".
std::string byte_level_encode(std::string_view bytes);
void byte_level_encode_append(std::string_view bytes, std::string& out);

// Mapped characters -> bytes. Characters outside the alphabet (and invalid UTF-8) are copied
// unchanged, so text that never went through the map survives.
void byte_level_decode_append(std::string_view mapped, std::string& out);
std::string byte_level_decode(std::string_view mapped);

}  // namespace kv
