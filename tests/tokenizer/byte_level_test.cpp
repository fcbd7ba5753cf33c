// The GPT-2 byte-level alphabet and the UTF-8 helpers, checked against the published definition
// (printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in byte order).
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "formats/tokenizer/byte_level.h"
#include "formats/tokenizer/utf8.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

TEST(ByteLevel, MapMatchesTheGpt2Definition) {
    // Bytes 0x00..0x20 are the first 33 remapped bytes -> U+0100..U+0120; 0x7F..0xA0 (34 bytes)
    // continue at U+0121..U+0142; 0xAD is the 68th and last -> U+0143.
    EXPECT_EQ(byte_level_codepoint(0x00), 0x100u);
    EXPECT_EQ(byte_level_codepoint('\n'), 0x10Au);
    EXPECT_EQ(byte_level_codepoint(' '), 0x120u);
    EXPECT_EQ(byte_level_codepoint(0x7F), 0x121u);
    EXPECT_EQ(byte_level_codepoint(0xA0), 0x142u);
    EXPECT_EQ(byte_level_codepoint(0xAD), 0x143u);
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = byte_level_codepoint(uint8_t(b));
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        if (printable) {
            EXPECT_EQ(cp, uint32_t(b)) << "byte " << b;
        }
        EXPECT_EQ(byte_level_byte(cp), b);
        seen.insert(cp);
    }
    EXPECT_EQ(seen.size(), 256u);
    EXPECT_EQ(byte_level_byte('A'), 'A');
    EXPECT_EQ(byte_level_byte(0x20), -1);  // a real space is not in the alphabet
    EXPECT_EQ(byte_level_encode(" hi\n"), "\xC4\xA0hi\xC4\x8A");  // "ĠhiĊ"
}

TEST(ByteLevel, RoundTripsEveryByteString) {
    std::mt19937_64 rng(test::seed_for("ByteLevel.RoundTrip"));
    for (int n = 0; n < 200; ++n) {
        std::string s(size_t(rng() % 64), '\0');
        for (char& c : s) c = char(rng() & 0xFF);
        const std::string m = byte_level_encode(s);
        EXPECT_TRUE(utf8::is_valid(m));
        EXPECT_EQ(byte_level_decode(m), s);
    }
}

TEST(Utf8, DecodeIsStrict) {
    uint32_t cp = 0;
    EXPECT_EQ(utf8::decode("\xC3\xA9", 0, &cp), 2);
    EXPECT_EQ(cp, 0xE9u);
    EXPECT_EQ(utf8::decode("\xF0\x9F\x98\x80", 0, &cp), 4);
    EXPECT_EQ(cp, 0x1F600u);
    EXPECT_EQ(utf8::decode("\xC0\xAF", 0, &cp), 0);      // overlong '/'
    EXPECT_EQ(utf8::decode("\xED\xA0\x80", 0, &cp), 0);  // surrogate U+D800
    EXPECT_EQ(utf8::decode("\xF4\x90\x80\x80", 0, &cp), 0);  // > U+10FFFF
    EXPECT_EQ(utf8::decode("\x80", 0, &cp), 0);
    EXPECT_EQ(utf8::decode("\xE2\x82", 0, &cp), 0);  // truncated
}

TEST(Utf8, IncompleteTailOnlyForValidPrefixes) {
    EXPECT_EQ(utf8::incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8::incomplete_tail("a\xC3"), 1u);              // first byte of é
    EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98"), 3u);      // 3 of 4 bytes of 😀
    EXPECT_EQ(utf8::incomplete_tail("a\xF0\x9F\x98\x80"), 0u);  // complete
    EXPECT_EQ(utf8::incomplete_tail("a\x80"), 0u);              // stray continuation: not pending
    EXPECT_EQ(utf8::incomplete_tail("a\xE0\x80"), 0u);          // E0 80 can never become valid
    EXPECT_EQ(utf8::incomplete_tail("\xC3\xA9\xE2\x82"), 2u);
}

}  // namespace
}  // namespace kv
