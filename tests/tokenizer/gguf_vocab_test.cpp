// make_bpe_tokenizer (GGUF vocabularies, issue 8): llama.cpp pre-tokenizer names select the split
// rules, control/user-defined token types become added tokens, and a GGUF vocabulary tokenizes
// exactly like the equivalent tokenizer.json (SmolLM2: Digits + ByteLevel).
#include <gtest/gtest.h>

#include <random>

#include "engine/core/error.h"
#include "tests/support/test_support.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using Ids = std::vector<int32_t>;

// Layout: 0..2 control, 3 user-defined, 4..259 bytes (byte x -> id 4 + x), then merge results.
int32_t b(char c) { return 4 + int32_t(static_cast<uint8_t>(c)); }
constexpr int32_t k34 = 260, k12 = 261, kHi = 262, kEacute = 263, kAbc = 264;

struct GgufVocab {
    std::vector<std::string> tokens;
    std::vector<std::string> merges;
    std::vector<int32_t> types;
};

GgufVocab vocab() {
    GgufVocab v;
    v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"};
    v.types = {3, 3, 3, 4};
    for (int x = 0; x < 256; ++x) {
        v.tokens.push_back(byte_level_encode(std::string(1, char(x))));
        v.types.push_back(1);
    }
    for (const char* t : {"34", "12", "hi", "\xC3\x83\xC2\xA9", "abc"}) {
        v.tokens.push_back(t);
        v.types.push_back(1);
    }
    v.merges = {"3 4", "1 2", "h i", "\xC3\x83 \xC2\xA9"};  // ranks 0..3; "abc" has no merge path
    return v;
}

std::unique_ptr<Tokenizer> make(const std::string& pre, int32_t bos = 1, int32_t eos = 2) {
    const GgufVocab v = vocab();
    return make_bpe_tokenizer(v.tokens, v.merges, v.types, bos, eos, -1, pre);
}

TEST(GgufVocab, PreTokenizerNamesSelectTheDigitRules) {
    // "1234" with merges (3,4)=0, (1,2)=1:
    // smollm: every digit is its own word -> four byte tokens, no merge can apply.
    EXPECT_EQ(make("smollm")->encode("1234", false), (Ids{b('1'), b('2'), b('3'), b('4')}));
    // gpt2: one word "1234" -> (3,4) first -> [1 2 34] -> (1,2) -> [12 34].
    EXPECT_EQ(make("gpt2")->encode("1234", false), (Ids{k12, k34}));
    EXPECT_EQ(make("gpt-2")->encode("1234", false), (Ids{k12, k34}));
    // llama-bpe: groups of three -> "123" -> [12 3] and "4": the (3,4) merge is never seen.
    EXPECT_EQ(make("llama-bpe")->encode("1234", false), (Ids{k12, b('3'), b('4')}));
    // qwen2: single digits like smollm.
    EXPECT_EQ(make("qwen2")->encode("1234", false), (Ids{b('1'), b('2'), b('3'), b('4')}));
    // default (llama.cpp fallback): digit runs, then triples -> "123" "4" as for llama3.
    EXPECT_EQ(make("default")->encode("1234", false), (Ids{k12, b('3'), b('4')}));
}

TEST(GgufVocab, Llama3IgnoresMergesAndAddsBos) {
    auto t = make("llama3");
    EXPECT_EQ(t->encode("abc", false), (Ids{kAbc}));  // whole word in vocab: no merging
    EXPECT_EQ(t->encode("abc"), (Ids{1, kAbc}));      // BOS by default for llama3
    EXPECT_EQ(make("gpt2")->encode("abc"), (Ids{b('a'), b('b'), b('c')}));
    // The GGUF's add_bos_token flag overrides the name's default.
    const GgufVocab v = vocab();
    auto no_bos = make_bpe_tokenizer(v.tokens, v.merges, v.types, 1, 2, -1, "llama-bpe", false);
    EXPECT_EQ(no_bos->encode("abc"), (Ids{kAbc}));
}

TEST(GgufVocab, Qwen2NormalizesToNfc) {
    EXPECT_EQ(make("qwen2")->encode("e\xCC\x81", false), (Ids{kEacute}));
    EXPECT_EQ(make("qwen2")->encode("\xC3\xA9", false), (Ids{kEacute}));
}

TEST(GgufVocab, ControlAndUserDefinedTokens) {
    auto t = make("smollm");
    // "user\nhi" between the markers -> words "user", "\n", "hi" ("h i" merges to 262).
    const Ids ids = t->encode("<|im_start|>user\nhi<|im_end|>", false);
    EXPECT_EQ(ids, (Ids{1, b('u'), b('s'), b('e'), b('r'), b('\n'), kHi, 2}));
    EXPECT_TRUE(t->is_special(1));
    EXPECT_FALSE(t->is_special(3));
    EXPECT_EQ(t->decode(ids, true), "user\nhi");
    EXPECT_EQ(t->decode(ids, false), "<|im_start|>user\nhi<|im_end|>");
    // parse_special=false: control text is plain text, user-defined tokens still match.
    const Ids plain = t->encode("<|im_end|><tool>", false, false);
    EXPECT_EQ(plain.back(), 3);
    // Words "<|", "im", "_", "end", "|>": no merge applies, so one byte token per character.
    EXPECT_EQ(plain.size(), std::string("<|im_end|>").size() + 1);
    EXPECT_EQ(t->decode(plain), "<|im_end|><tool>");
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_ids(), (Ids{2, 0}));  // eos, then <|endoftext|> as an end-of-generation marker
    EXPECT_EQ(t->vocab_size(), 265);
    EXPECT_EQ(t->token_id("hi"), kHi);
    EXPECT_EQ(t->token_to_piece(b(' ')), " ");
}

TEST(GgufVocab, MatchesTheEquivalentTokenizerJson) {
    // SmolLM2's tokenizer.json shape: Sequence[Digits(individual), ByteLevel(use_regex)].
    const GgufVocab v = vocab();
    nlohmann::json vj = nlohmann::json::object();
    for (size_t i = 0; i < v.tokens.size(); ++i) vj[v.tokens[i]] = i;
    nlohmann::json j = test::gpt2_style_json(vj, v.merges);
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           nlohmann::json::array({{{"type", "Digits"}, {"individual_digits", true}},
                                                  {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                                   {"trim_offsets", true}, {"use_regex", true}}})}};
    for (int i = 0; i < 4; ++i)
        j["added_tokens"].push_back({{"id", i}, {"content", v.tokens[size_t(i)]}, {"special", i < 3},
                                     {"normalized", false}, {"lstrip", false}, {"rstrip", false},
                                     {"single_word", false}});
    auto from_json = test::load_json_tokenizer("gguf_vs_json", j);
    auto from_gguf = make("smollm");

    const std::vector<std::string> alphabet = {"a", "b", "h", "i", "1", "2", "3", "4", " ", "  ", "\n", "\t", "'s",
                                               ",", "!", "\xC3\xA9", "\xF0\x9F\x98\x80", "<|im_end|>", "<tool>", "abc"};
    std::mt19937_64 rng(test::seed_for("GgufVocab.MatchesJson"));
    for (int n = 0; n < 300; ++n) {
        std::string s;
        for (int k = int(rng() % 24); k > 0; --k) s += alphabet[rng() % alphabet.size()];
        const Ids a = from_gguf->encode(s, false), c = from_json->encode(s, false);
        EXPECT_EQ(a, c) << "text: \"" << s << "\"";
        EXPECT_EQ(from_gguf->decode(a), s);
    }
}

TEST(GgufVocab, ErrorsNameTheProblem) {
    const GgufVocab v = vocab();
    auto expect_error = [](auto&& fn, const std::string& needle) {
        try {
            fn();
            ADD_FAILURE() << "expected kv::Error containing " << needle;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error([&] { make_bpe_tokenizer(v.tokens, v.merges, v.types, 1, 2, -1, "frobnicate", {}, {}, "m.gguf"); },
                 "m.gguf: pre-tokenizer \"frobnicate\" (tokenizer.ggml.pre) is not supported");
    expect_error([&] { make_bpe_tokenizer(v.tokens, v.merges, {1, 2}, 1, 2, -1, "gpt2"); },
                 "tokenizer.ggml.token_type has 2 entries for 265 tokens");
    expect_error([&] { make_bpe_tokenizer(v.tokens, {"q zz"}, v.types, 1, 2, -1, "gpt2"); },
                 "refers to \"zz\", which is not in the vocab");
    expect_error([&] { make_bpe_tokenizer(v.tokens, {"nospace"}, v.types, 1, 2, -1, "gpt2"); },
                 "tokenizer.ggml.merges[0] \"nospace\" is not two tokens");
    expect_error([&] { make_bpe_tokenizer(v.tokens, v.merges, v.types, 999, 2, -1, "gpt2"); },
                 "tokenizer.ggml.bos_token_id 999 is out of range");
}

}  // namespace
}  // namespace kv
