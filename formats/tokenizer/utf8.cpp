// UTF-8 decoding/encoding used by every tokenizer stage. Strict: overlong forms, surrogates and
// code points above U+10FFFF are invalid, so invalid input bytes are always handled as bytes.
// Must stay free of tokenizer knowledge.
#include "utf8.h"

namespace kv::utf8 {

namespace {
// Valid range of the second byte for a given lead (RFC 3629 table); continuation bytes after
// the second are always 0x80..0xBF.
bool second_byte_ok(unsigned char lead, unsigned char b) {
    if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
    if (lead == 0xED) return b >= 0x80 && b <= 0x9F;  // excludes surrogates
    if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
    if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;  // <= U+10FFFF
    return b >= 0x80 && b <= 0xBF;
}

int expected_length(unsigned char lead) {
    if (lead < 0x80) return 1;
    if (lead >= 0xC2 && lead <= 0xDF) return 2;
    if (lead >= 0xE0 && lead <= 0xEF) return 3;
    if (lead >= 0xF0 && lead <= 0xF4) return 4;
    return 0;  // continuation byte, C0/C1 (overlong) or F5..FF
}
}  // namespace

int decode(std::string_view s, size_t i, uint32_t* cp) {
    if (i >= s.size()) return 0;
    const auto lead = static_cast<unsigned char>(s[i]);
    const int n = expected_length(lead);
    if (n == 0 || i + size_t(n) > s.size()) return 0;
    if (n == 1) {
        *cp = lead;
        return 1;
    }
    if (!second_byte_ok(lead, static_cast<unsigned char>(s[i + 1]))) return 0;
    uint32_t v = lead & (0xFFu >> (n + 1));
    for (int k = 1; k < n; ++k) {
        const auto b = static_cast<unsigned char>(s[i + size_t(k)]);
        if ((b & 0xC0) != 0x80) return 0;
        v = (v << 6) | (b & 0x3Fu);
    }
    *cp = v;
    return n;
}

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

bool is_valid(std::string_view s) {
    uint32_t cp;
    for (size_t i = 0; i < s.size();) {
        const int n = decode(s, i, &cp);
        if (n == 0) return false;
        i += size_t(n);
    }
    return true;
}

size_t incomplete_tail(std::string_view s) {
    // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
    const size_t max_back = s.size() < 3 ? s.size() : 3;
    for (size_t back = 1; back <= max_back; ++back) {
        const size_t i = s.size() - back;
        const auto lead = static_cast<unsigned char>(s[i]);
        if ((lead & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
        const int n = expected_length(lead);
        if (n <= int(back)) return 0;  // complete (or invalid) sequence: nothing pending
        if (back >= 2 && !second_byte_ok(lead, static_cast<unsigned char>(s[i + 1]))) return 0;
        return back;  // bytes i..end are a valid prefix of an n-byte sequence
    }
    return 0;
}

}  // namespace kv::utf8
