// Unicode normalization: NFC composes a decomposed é (U+0065 U+0301) into U+00E9, so a Qwen-style
// tokenizer.json (normalizer NFC) gives the single merged token for both spellings.
#include <gtest/gtest.h>

#include "formats/tokenizer/normalizer.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using nlohmann::json;

const std::string kComposed = "\xC3\xA9";      // U+00E9
const std::string kDecomposed = "e\xCC\x81";   // U+0065 U+0301

TEST(Normalizer, UnicodeForms) {
    EXPECT_EQ(unicode_transform(kDecomposed, NormKind::NFC), kComposed);
    EXPECT_EQ(unicode_transform(kComposed, NormKind::NFD), kDecomposed);
    EXPECT_EQ(unicode_transform("\xEF\xAC\x81", NormKind::NFKC), "fi");  // U+FB01 ligature
    EXPECT_EQ(unicode_transform("\xC3\x80" "B", NormKind::LOWERCASE), "\xC3\xA0" "b");  // ÀB -> àb
    // Invalid bytes pass through; the valid runs around them are still normalized.
    EXPECT_EQ(unicode_transform("a\xFF" + kDecomposed, NormKind::NFC), "a\xFF" + kComposed);
}

TEST(Normalizer, NfcMakesADecomposedAccentOneToken) {
    // Byte-level: é = C3 A9 -> characters "Ã" (U+00C3) "©" (U+00A9); one merge "Ã ©" -> "Ã©" (id 256).
    // The decomposed form is bytes 65 CC 81 -> "e", "Ì", and 0x81 -> remapped U+0122: three tokens.
    json vocab = test::byte_vocab();
    vocab["\xC3\x83\xC2\xA9"] = 256;
    json j = test::gpt2_style_json(vocab, json::array({"\xC3\x83 \xC2\xA9"}));
    auto plain = test::load_json_tokenizer("nfc_off", j);
    EXPECT_EQ(plain->encode(kComposed, false), (std::vector<int32_t>{256}));
    EXPECT_EQ(plain->encode(kDecomposed, false), (std::vector<int32_t>{'e', 0xCC, 0x81}));

    j["normalizer"] = {{"type", "NFC"}};
    auto nfc = test::load_json_tokenizer("nfc_on", j);
    EXPECT_EQ(nfc->encode(kDecomposed, false), (std::vector<int32_t>{256}));
    EXPECT_EQ(nfc->encode("caf" + kDecomposed, false), (std::vector<int32_t>{'c', 'a', 'f', 256}));
}

TEST(Normalizer, SequenceOfEdits) {
    Normalizer n;
    NormStep prepend;
    prepend.kind = NormKind::PREPEND;
    prepend.text = "_";
    n.add(prepend);
    NormStep rep;
    rep.kind = NormKind::REPLACE;
    rep.literal = " ";
    rep.text = "_";
    n.add(rep);
    EXPECT_EQ(n.apply("a b"), "_a_b");
    EXPECT_EQ(n.apply(""), "");  // Prepend leaves empty text empty
}

}  // namespace
}  // namespace kv
