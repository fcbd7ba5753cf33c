// GPT-2 byte <-> unicode tables, built at compile time (no runtime state).
// Must not depend on vocabularies or regexes; byte_level_decode is the exact inverse of encode.
#include "byte_level.h"

#include <array>

#include "utf8.h"

namespace kv {

namespace {

constexpr bool maps_to_itself(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

// Highest mapped code point: U+0100 + 67 = U+0143.
constexpr uint32_t kMaxMapped = 0x143;

struct Tables {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, kMaxMapped + 1> to_byte{};
    // UTF-8 of each mapped code point (1 or 2 bytes) and its length.
    std::array<std::array<char, 2>, 256> utf8{};
    std::array<uint8_t, 256> utf8_len{};
};

constexpr Tables build_tables() {
    Tables t{};
    for (auto& v : t.to_byte) v = -1;
    uint32_t next = 0x100;
    for (unsigned b = 0; b < 256; ++b) {
        const uint32_t cp = maps_to_itself(b) ? b : next++;
        t.to_cp[b] = cp;
        t.to_byte[cp] = int16_t(b);
        if (cp < 0x80) {
            t.utf8[b] = {char(cp), 0};
            t.utf8_len[b] = 1;
        } else {
            t.utf8[b] = {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
            t.utf8_len[b] = 2;
        }
    }
    return t;
}

constexpr Tables kTables = build_tables();
static_assert(kTables.to_cp[' '] == 0x120, "space maps to U+0120");
static_assert(kTables.to_cp['\n'] == 0x10A, "newline maps to U+010A");
static_assert(kTables.to_cp[0xAD] == 0x143, "the soft hyphen is the 68th remapped byte");

}  // namespace

uint32_t byte_level_codepoint(uint8_t b) { return kTables.to_cp[b]; }

int byte_level_byte(uint32_t cp) { return cp <= kMaxMapped ? kTables.to_byte[cp] : -1; }

void byte_level_encode_append(std::string_view bytes, std::string& out) {
    for (char c : bytes) {
        const auto b = static_cast<uint8_t>(c);
        out.append(kTables.utf8[b].data(), kTables.utf8_len[b]);
    }
}

std::string byte_level_encode(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    byte_level_encode_append(bytes, out);
    return out;
}

void byte_level_decode_append(std::string_view mapped, std::string& out) {
    for (size_t i = 0; i < mapped.size();) {
        uint32_t cp;
        const int n = utf8::decode(mapped, i, &cp);
        if (n == 0) {  // not UTF-8: cannot be a mapped character, keep the byte
            out.push_back(mapped[i]);
            ++i;
            continue;
        }
        const int b = byte_level_byte(cp);
        if (b >= 0) {
            out.push_back(char(b));
        } else {
            out.append(mapped.substr(i, size_t(n)));
        }
        i += size_t(n);
    }
}

std::string byte_level_decode(std::string_view mapped) {
    std::string out;
    out.reserve(mapped.size());
    byte_level_decode_append(mapped, out);
    return out;
}

}  // namespace kv
