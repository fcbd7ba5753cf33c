// tokenizer.json byte-level BPE on hand-made vocabularies: every expected encoding below is
// derived by hand from the BPE rule (repeatedly merge the adjacent pair with the lowest merge
// rank, leftmost first), shown in the comments. Also: both merges formats, ignore_merges, added
// tokens cut out before pre-tokenization, the post-processor and side files.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "engine/core/error.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using nlohmann::json;

// Ids 0..255: bytes. Merged tokens get ids from 256 in this order.
const std::vector<std::string> kMerged = {"\xC4\xA0t", "he", "\xC4\xA0the", "ll", "ell", "hell", "hello", "ab", "abc"};
int32_t id_of(const std::string& tok) {
    for (size_t i = 0; i < kMerged.size(); ++i)
        if (kMerged[i] == tok) return int32_t(256 + i);
    return static_cast<uint8_t>(tok[0]);  // single printable ASCII byte: its own id
}

json hand_vocab() {
    json v = test::byte_vocab();
    for (size_t i = 0; i < kMerged.size(); ++i) v[kMerged[i]] = 256 + int(i);
    return v;
}

// Merge list A (rank order): Ġ t, h e, Ġt he, l l, e ll, h ell, hell o, a b
const std::vector<std::pair<std::string, std::string>> kMergesA = {
    {"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"l", "l"}, {"e", "ll"}, {"h", "ell"}, {"hell", "o"}, {"a", "b"}};

json merges_as_strings(const std::vector<std::pair<std::string, std::string>>& m) {
    json a = json::array();
    for (const auto& [x, y] : m) a.push_back(x + " " + y);
    return a;
}
json merges_as_pairs(const std::vector<std::pair<std::string, std::string>>& m) {
    json a = json::array();
    for (const auto& [x, y] : m) a.push_back(json::array({x, y}));
    return a;
}

TEST(BpeJson, HandDerivedEncodingsFollowMergeRanks) {
    auto tok = test::load_json_tokenizer("hand_a", test::gpt2_style_json(hand_vocab(), merges_as_strings(kMergesA)));
    // "hello the" -> GPT-2 regex -> "hello", " the" -> byte-level "hello", "Ġthe".
    // "hello": h e l l o. Ranks: (h,e)=1 (l,l)=3 -> merge h e -> [he l l o]; pairs (he,l) none,
    //   (l,l)=3 -> [he ll o]; (he,ll), (ll,o) are not merges -> done: he, ll, o.
    //   (Merge "e ll" never applies because "h e" ranks first and consumes the e.)
    // "Ġthe": Ġ t h e. (Ġ,t)=0 -> [Ġt h e]; (Ġt,h) none, (h,e)=1 -> [Ġt he]; (Ġt,he)=2 -> [Ġthe].
    const std::vector<int32_t> expect = {id_of("he"), id_of("ll"), 'o', id_of("\xC4\xA0the")};
    EXPECT_EQ(tok->encode("hello the", false), expect);
    EXPECT_EQ(tok->decode(expect), "hello the");
    // "abc": (a,b)=7 -> [ab c]; "ab c" is not a merge, so "abc" stays two tokens.
    EXPECT_EQ(tok->encode("abc", false), (std::vector<int32_t>{id_of("ab"), 'c'}));
    EXPECT_EQ(tok->vocab_size(), 256 + int32_t(kMerged.size()));
    EXPECT_EQ(tok->token_to_piece(id_of("\xC4\xA0the")), " the");
    EXPECT_EQ(tok->token_id(" the"), id_of("\xC4\xA0the"));
    EXPECT_EQ(tok->token_id("A"), 'A');
    EXPECT_EQ(tok->token_id("not a token"), -1);
}

TEST(BpeJson, ReorderedMergesChangeTheResult) {
    // Merge list B puts "l l" first: hello -> h e l l o; (l,l)=0 -> [h e ll o]; (h,e)=2,
    // (e,ll)=1 -> e ll wins -> [h ell o]; (h,ell)=3 -> [hell o]; (hell,o)=4 -> [hello].
    const std::vector<std::pair<std::string, std::string>> b = {{"l", "l"}, {"e", "ll"}, {"h", "e"}, {"h", "ell"},
                                                                {"hell", "o"}, {"\xC4\xA0", "t"}, {"h", "e"}};
    auto tok = test::load_json_tokenizer("hand_b", test::gpt2_style_json(hand_vocab(), merges_as_strings(b)));
    EXPECT_EQ(tok->encode("hello", false), (std::vector<int32_t>{id_of("hello")}));
}

TEST(BpeJson, BothMergeFormatsGiveTheSameTokenizer) {
    auto s = test::load_json_tokenizer("fmt_str", test::gpt2_style_json(hand_vocab(), merges_as_strings(kMergesA)));
    auto p = test::load_json_tokenizer("fmt_pair", test::gpt2_style_json(hand_vocab(), merges_as_pairs(kMergesA)));
    for (const std::string text : {"hello the hell", "abcab the\nthe", "shell-hello, 1234"})
        EXPECT_EQ(s->encode(text, false), p->encode(text, false)) << text;
}

TEST(BpeJson, IgnoreMergesEmitsWholeVocabWords) {
    json j = test::gpt2_style_json(hand_vocab(), merges_as_strings(kMergesA));
    auto plain = test::load_json_tokenizer("ign_off", j);
    // Without ignore_merges: "abc" -> [ab c] (derived above), though "abc" itself is a token.
    EXPECT_EQ(plain->encode("abc", false), (std::vector<int32_t>{id_of("ab"), 'c'}));
    j["model"]["ignore_merges"] = true;
    auto llama3 = test::load_json_tokenizer("ign_on", j);
    // With it (Llama 3): the whole pre-token "abc" is in the vocab and is emitted as is.
    EXPECT_EQ(llama3->encode("abc", false), (std::vector<int32_t>{id_of("abc")}));
    // "hello" is a vocab token too: whole with ignore_merges, [he ll o] without (derived above).
    EXPECT_EQ(llama3->encode("hello", false), (std::vector<int32_t>{id_of("hello")}));
    EXPECT_EQ(plain->encode("hello", false), (std::vector<int32_t>{id_of("he"), id_of("ll"), 'o'}));
    // A word not in the vocab still goes through the merges: "shello" = s h e l l o ->
    // (h,e)=1 -> [s he l l o] -> (l,l)=3 -> [s he ll o].
    EXPECT_EQ(llama3->encode("shello", false), (std::vector<int32_t>{'s', id_of("he"), id_of("ll"), 'o'}));
}

json added(int id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool single_word = false) {
    return json{{"id", id},           {"content", content}, {"special", special},       {"lstrip", lstrip},
                {"rstrip", rstrip},   {"single_word", single_word}, {"normalized", false}};
}

TEST(BpeJson, AddedTokensAreCutOutBeforePreTokenization) {
    json j = test::gpt2_style_json(test::byte_vocab(), json::array());
    j["added_tokens"] = json::array({added(300, "<|end|>", true), added(301, "<mask>", false, true),
                                     added(302, "<R>", false, false, true), added(303, "<w>", false, false, false, true)});
    auto tok = test::load_json_tokenizer("added", j);
    // The GPT-2 regex alone would cut "<|end|>" into "<|", "end", "|>"; the added token wins.
    EXPECT_EQ(tok->encode("hi<|end|>x", false), (std::vector<int32_t>{'h', 'i', 300, 'x'}));
    // parse_special=false: special text is ordinary text (7 byte tokens), non-special still match.
    const auto plain = tok->encode("<|end|>", false, false);
    EXPECT_EQ(plain.size(), 7u);
    EXPECT_EQ(tok->decode(plain), "<|end|>");
    EXPECT_TRUE(tok->is_special(300));
    EXPECT_FALSE(tok->is_special(301));
    EXPECT_EQ(tok->decode({'h', 300, 'i'}, true), "hi");
    EXPECT_EQ(tok->decode({'h', 300, 'i'}, false), "h<|end|>i");
    EXPECT_EQ(tok->token_id("<|end|>"), 300);
    EXPECT_EQ(tok->vocab_size(), 304);
    // lstrip: "a <mask> b" -> the space before <mask> belongs to the token; " b" keeps its space
    // ("Ġb" is not a merge here, so it is the byte tokens ' ' and 'b').
    EXPECT_EQ(tok->encode("a <mask> b", false), (std::vector<int32_t>{'a', 301, ' ', 'b'}));
    // rstrip: "a<R>  b" -> both spaces after <R> are swallowed.
    EXPECT_EQ(tok->encode("a<R>  b", false), (std::vector<int32_t>{'a', 302, 'b'}));
    // single_word: inside a word it is text (3 byte tokens), between spaces it matches.
    EXPECT_EQ(tok->encode("x<w>", false).size(), 4u);
    EXPECT_EQ(tok->encode("x <w> y", false), (std::vector<int32_t>{'x', ' ', 303, ' ', 'y'}));
}

TEST(BpeJson, TemplatePostProcessorAndSideFiles) {
    json j = test::gpt2_style_json(test::byte_vocab(), json::array());
    j["added_tokens"] = json::array({added(256, "<|begin_of_text|>", true), added(257, "<|eot_id|>", true),
                                     added(258, "<|end_of_text|>", true)});
    j["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         json::array({{{"type", "ByteLevel"}, {"trim_offsets", false}},
                      {{"type", "TemplateProcessing"},
                       {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                       {"pair", json::array()},
                       {"special_tokens",
                        {{"<|begin_of_text|>",
                          {{"id", "<|begin_of_text|>"}, {"ids", json::array({256})}, {"tokens", json::array({"<|begin_of_text|>"})}}}}}}})}};
    const std::string dir = test::scratch_dir("template");
    test::write_text(dir + "/tokenizer.json", j.dump());
    // Bare tokenizer.json: BOS comes from the template, EOS from well-known names.
    {
        auto tok = load_tokenizer(dir);
        EXPECT_EQ(tok->encode("hi"), (std::vector<int32_t>{256, 'h', 'i'}));
        EXPECT_EQ(tok->encode("hi", false), (std::vector<int32_t>{'h', 'i'}));
        EXPECT_EQ(tok->bos_id(), 256);
        EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{257, 258}));  // order of the name list
        EXPECT_EQ(tok->pad_id(), -1);
    }
    // Side files name them: tokenizer_config.json first, then generation_config.json ids.
    test::write_text(dir + "/tokenizer_config.json",
                     R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}, "pad_token": null})");
    test::write_text(dir + "/generation_config.json", R"({"eos_token_id": [258, 257], "pad_token_id": 258})");
    {
        auto tok = load_tokenizer(dir);
        EXPECT_EQ(tok->bos_id(), 256);
        EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{257, 258}));
        EXPECT_EQ(tok->eos_id(), 257);
        EXPECT_EQ(tok->pad_id(), -1);  // explicit null in tokenizer_config.json wins
    }
    // add_bos_token=false in tokenizer_config.json removes the template's BOS.
    test::write_text(dir + "/tokenizer_config.json", R"({"add_bos_token": false})");
    EXPECT_EQ(load_tokenizer(dir)->encode("hi"), (std::vector<int32_t>{'h', 'i'}));
}

TEST(BpeJson, SentencePieceStyleBpeWithByteFallback) {
    // Llama 2 / Mistral tokenizer.json shape: no byte-level map; "▁" marks spaces; characters
    // missing from the vocab become <0xNN> tokens.
    const std::string S = "\xE2\x96\x81";  // ▁
    json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {S, 3}, {"h", 4}, {"i", 5}, {S + "h", 6}, {S + "hi", 7}};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", b);
        vocab[name] = 8 + b;
    }
    json j = {{"added_tokens", json::array({added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)})},
              {"normalizer", {{"type", "Sequence"},
                              {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", S}},
                                                           {{"type", "Replace"}, {"pattern", {{"String", " "}}},
                                                            {"content", S}}})}}},
              {"pre_tokenizer", nullptr},
              {"post_processor", {{"type", "TemplateProcessing"},
                                  {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                  {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", json::array({1})}, {"tokens", json::array({"<s>"})}}}}}}},
              {"decoder", {{"type", "Sequence"},
                           {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", S}}}, {"content", " "}},
                                                     {{"type", "ByteFallback"}},
                                                     {{"type", "Fuse"}},
                                                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({S + " h", S + "h i"})},
                         {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}}}};
    auto tok = test::load_json_tokenizer("spm_bpe", j);
    // "hi é" -> Prepend/Replace -> "▁hi▁é" (one word, no pre-tokenizer): ▁ h i ▁ é.
    // é is not in the vocab -> bytes C3 A9 -> <0xC3>=8+195, <0xA9>=8+169.
    // Merges: (▁,h)=0 at position 0 -> [▁h i ▁ C3 A9]; (▁h,i)=1 -> [▁hi ▁ C3 A9].
    const std::vector<int32_t> expect = {1, 7, 3, 8 + 0xC3, 8 + 0xA9};
    EXPECT_EQ(tok->encode("hi \xC3\xA9"), expect);
    // Decode: "<s>" is special and skipped; "▁hi▁" + bytes -> " hi é" -> Strip one leading space.
    EXPECT_EQ(tok->decode(expect, true), "hi \xC3\xA9");
    EXPECT_EQ(tok->token_to_piece(7), " hi");
    EXPECT_EQ(tok->token_to_piece(8 + '\n'), "\n");
    EXPECT_EQ(tok->token_id(" hi"), 7);
    EXPECT_EQ(tok->token_id("\n"), 8 + '\n');
}

TEST(BpeJson, HugeWordsAndWhitespaceRuns) {
    // One 200 000-letter word: merge (l,l) applies leftmost first, pairing positions 0-1, 2-3, ...
    // -> 100 000 "ll" tokens. A 100 000-space run before "x": "\s+(?!\S)" keeps all but the last
    // space (99 999 'Ġ' byte tokens, no merges), then " x" -> 'Ġ' 'x'.
    auto tok = test::load_json_tokenizer("huge", test::gpt2_style_json(hand_vocab(), merges_as_strings(kMergesA)));
    const auto ids = tok->encode(std::string(200000, 'l'), false);
    ASSERT_EQ(ids.size(), 100000u);
    EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [](int32_t id) { return id == id_of("ll"); }));
    const std::string spaces = std::string(100000, ' ') + "x";
    const auto sp = tok->encode(spaces, false);
    ASSERT_EQ(sp.size(), 100001u);
    EXPECT_EQ(sp.back(), 'x');
    EXPECT_EQ(tok->decode(sp), spaces);
}

TEST(BpeJson, ConcurrentEncodersAgree) {
    // The word cache is shared: several threads encoding at once must see the same ids.
    auto tok = test::load_json_tokenizer("threads", test::gpt2_style_json(hand_vocab(), merges_as_strings(kMergesA)));
    std::string text;
    for (int i = 0; i < 2000; ++i) text += (i % 3 ? " hello the" : " shell abc ") + std::to_string(i);
    const auto expect = tok->encode(text, false);
    std::vector<std::vector<int32_t>> got(4);
    std::vector<std::thread> th;
    for (size_t k = 0; k < got.size(); ++k) th.emplace_back([&, k] { got[k] = tok->encode(text, false); });
    for (auto& t : th) t.join();
    for (const auto& g : got) EXPECT_TRUE(g == expect);
}

TEST(BpeJson, DecodeRejectsOutOfRangeIds) {
    auto tok = test::load_json_tokenizer("range", test::gpt2_style_json(test::byte_vocab(), json::array()));
    try {
        tok->decode({1, 256});
        FAIL() << "expected kv::Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("token id 256 is out of range"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
