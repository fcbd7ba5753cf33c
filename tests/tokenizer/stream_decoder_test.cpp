// StreamDecoder: pushed one id at a time, it must return only complete UTF-8 (a 4-byte emoji
// spread over four byte tokens appears once, with its last byte), keep leading spaces that
// Metaspace decoding strips at the start of a sequence, and add up to decode() of the whole.
#include <gtest/gtest.h>

#include <random>

#include "formats/tokenizer/stream_decoder.h"
#include "formats/tokenizer/utf8.h"
#include "tests/support/test_support.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using nlohmann::json;

std::vector<std::string> stream(const Tokenizer& t, const std::vector<int32_t>& ids, std::string* tail,
                                bool skip = true) {
    StreamDecoder d(t, skip);
    std::vector<std::string> out;
    for (int32_t id : ids) out.push_back(d.push(id));
    *tail = d.flush();
    return out;
}

TEST(StreamDecoder, NeverSplitsAUtf8Sequence) {
    // Byte vocabulary without merges: every byte is one token.
    auto t = test::load_json_tokenizer("stream_bytes", test::gpt2_style_json(test::byte_vocab(), json::array()));
    const std::string text = "h\xC3\xA9 \xF0\x9F\x98\x80!";  // "hé 😀!"
    const auto ids = t->encode(text, false);
    ASSERT_EQ(ids.size(), text.size());
    std::string tail;
    const auto chunks = stream(*t, ids, &tail);
    // Bytes: h | C3 A9 | ' ' | F0 9F 98 80 | !  -> output only when a character is complete.
    const std::vector<std::string> expect = {"h", "", "\xC3\xA9", " ", "", "", "", "\xF0\x9F\x98\x80", "!"};
    EXPECT_EQ(chunks, expect);
    EXPECT_EQ(tail, "");
}

TEST(StreamDecoder, FlushReturnsAnUnfinishedSequence) {
    auto t = test::load_json_tokenizer("stream_flush", test::gpt2_style_json(test::byte_vocab(), json::array()));
    StreamDecoder d(*t);
    EXPECT_EQ(d.push('a'), "a");
    EXPECT_EQ(d.push(0xE2), "");
    EXPECT_EQ(d.push(0x82), "");
    EXPECT_EQ(d.flush(), "\xE2\x82");  // raw bytes of the unfinished "€"
    // An invalid byte is not held back: it cannot start a sequence.
    EXPECT_EQ(d.push(0xFF), "\xFF");
}

TEST(StreamDecoder, KeepsSpacesWithMetaspaceDecoding) {
    const std::string S = "\xE2\x96\x81";
    json vocab = {{S, 0}, {"a", 1}, {"b", 2}, {S + "a", 3}, {S + "b", 4}, {"<s>", 5}};
    json j = {{"added_tokens", json::array({{{"id", 5}, {"content", "<s>"}, {"special", true}}})},
              {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", S}, {"prepend_scheme", "always"}}},
              {"decoder", {{"type", "Metaspace"}, {"replacement", S}, {"prepend_scheme", "always"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({S + " a", S + " b"})}}}};
    auto t = test::load_json_tokenizer("stream_meta", j);
    const auto ids = t->encode("a b a", false);
    ASSERT_EQ(ids, (std::vector<int32_t>{3, 4, 3}));
    EXPECT_EQ(t->decode(ids), "a b a");  // the first token's space is the prepended one
    std::string tail;
    EXPECT_EQ(stream(*t, ids, &tail), (std::vector<std::string>{"a", " b", " a"}));
    // Continuing after a prompt: the context token absorbs the start-of-text stripping.
    StreamDecoder d(*t, true, {3});
    EXPECT_EQ(d.push(4), " b");
    // A special token in the stream prints nothing when skipped, its text otherwise.
    EXPECT_EQ(stream(*t, {3, 5, 4}, &tail), (std::vector<std::string>{"a", "", " b"}));
    EXPECT_EQ(stream(*t, {3, 5, 4}, &tail, false), (std::vector<std::string>{"a", "<s>", " b"}));
}

TEST(StreamDecoder, ChunksAddUpToDecode) {
    json vocab = test::byte_vocab();
    vocab["\xC4\xA0w"] = 256;
    // Bytes F0 9F (the start of most emoji) map to "ð" U+00F0 and "Ł" U+0141: a merged token that
    // ends in the middle of a character.
    vocab["\xC3\xB0\xC5\x81"] = 257;
    auto t = test::load_json_tokenizer(
        "stream_random", test::gpt2_style_json(vocab, json::array({"\xC4\xA0 w", "\xC3\xB0 \xC5\x81"})));
    const std::vector<std::string> alphabet = {"w", " w", "x", " ", "\xC3\xA9", "\xF0\x9F\x98\x80", "\n", "\xE4\xB8\xAD"};
    std::mt19937_64 rng(test::seed_for("StreamDecoder.ChunksAddUp"));
    for (int n = 0; n < 200; ++n) {
        std::string s;
        for (int k = int(rng() % 16); k > 0; --k) s += alphabet[rng() % alphabet.size()];
        const auto ids = t->encode(s, false);
        std::string tail, joined;
        for (const std::string& c : stream(*t, ids, &tail)) {
            EXPECT_TRUE(utf8::is_valid(c)) << "chunk of \"" << s << "\"";
            joined += c;
        }
        EXPECT_EQ(joined + tail, s);
        EXPECT_EQ(tail, "");
    }
}

}  // namespace
}  // namespace kv
