// SentencePiece through libsentencepiece: a tiny Llama-style model (BPE, byte fallback, identity
// normalization) is trained here from a generated corpus, then loaded through load_tokenizer and
// checked for round trips, known pieces, special ids and control-token handling.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>

#include "engine/core/error.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

class SentencePiece : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(test::scratch_dir("spm"));
        std::string corpus;
        const char* lines[] = {"hello world", "hello there, the quick brown fox", "jumps over the lazy dog",
                               "hello again and again", "numbers like 12 and 345 appear", "a separator <sep> here"};
        for (int rep = 0; rep < 40; ++rep)
            for (const char* l : lines) corpus += std::string(l) + "\n";
        test::write_text(*dir_ + "/corpus.txt", corpus);
        const std::string args = "--input=" + *dir_ + "/corpus.txt --model_prefix=" + *dir_ +
                                 "/tokenizer --vocab_size=320 --model_type=bpe --character_coverage=1.0"
                                 " --byte_fallback=true --normalization_rule_name=identity"
                                 " --remove_extra_whitespaces=false --split_digits=true --hard_vocab_limit=false"
                                 " --user_defined_symbols=<sep> --control_symbols=<ctl> --minloglevel=2";
        const auto st = sentencepiece::SentencePieceTrainer::Train(args);
        ASSERT_TRUE(st.ok()) << st.ToString();
    }
    static void TearDownTestSuite() { delete dir_; }
    static std::string* dir_;
};
std::string* SentencePiece::dir_ = nullptr;

TEST_F(SentencePiece, LoadsFromTheFolderWithLlamaDefaults) {
    auto t = load_tokenizer(*dir_);
    EXPECT_EQ(t->kind(), "sentencepiece");
    // SentencePiece's trainer defaults: unk 0, bos 1, eos 2, no pad.
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_ids(), (std::vector<int32_t>{2}));
    EXPECT_EQ(t->pad_id(), -1);
    EXPECT_TRUE(t->is_special(1));
    EXPECT_FALSE(t->is_special(0));
    EXPECT_EQ(t->token_to_piece(1), "<s>");
    // BOS is added by default (transformers' LlamaTokenizer), not without special tokens.
    EXPECT_EQ(t->encode("hello").front(), 1);
    EXPECT_NE(t->encode("hello", false).front(), 1);
}

TEST_F(SentencePiece, KnownPiecesAndRoundTrips) {
    auto t = load_tokenizer(*dir_ + "/tokenizer.model");
    // "hello" starts 4 of every 6 corpus lines, so BPE learns the whole word with its space mark.
    const int32_t hello = t->token_id(" hello");
    ASSERT_GE(hello, 0);
    EXPECT_EQ(t->encode("hello", false), (std::vector<int32_t>{hello}));
    EXPECT_EQ(t->token_to_piece(hello), " hello");
    // split_digits: no piece holds two digits, although "12" and "345" are frequent.
    for (int32_t id : t->encode("12345", false)) {
        const std::string p = t->token_to_piece(id);
        EXPECT_LE(std::count_if(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }), 1) << p;
    }
    // Byte fallback: the emoji and the newline are not in the trained characters.
    for (const std::string s : {"hello world", "the lazy fox jumps", "tab\tand newline\n", "emoji \xF0\x9F\x98\x80!",
                                "  two leading spaces"}) {
        EXPECT_EQ(t->decode(t->encode(s), true), s) << s;
    }
    const int32_t nl = t->token_id("\n");
    ASSERT_GE(nl, 0);
    EXPECT_EQ(t->token_to_piece(nl), "\n");
    EXPECT_EQ(t->decode({1, hello}, false), "<s>hello");
}

TEST_F(SentencePiece, UserDefinedAndControlSymbols) {
    auto t = load_tokenizer(*dir_);
    const int32_t sep = t->token_id("<sep>"), ctl = t->token_id("<ctl>");
    ASSERT_GE(sep, 0);
    ASSERT_GE(ctl, 0);
    EXPECT_TRUE(t->is_special(ctl));
    EXPECT_FALSE(t->is_special(sep));
    auto contains = [](const std::vector<int32_t>& v, int32_t id) {
        return std::find(v.begin(), v.end(), id) != v.end();
    };
    // SentencePiece itself matches user-defined symbols; control symbols only with parse_special.
    EXPECT_TRUE(contains(t->encode("a<sep>b", false), sep));
    EXPECT_TRUE(contains(t->encode("a<ctl>b", false, true), ctl));
    EXPECT_FALSE(contains(t->encode("a<ctl>b", false, false), ctl));
    // The text after a control token is encoded on its own and gets SentencePiece's dummy-prefix
    // space, as in llama.cpp and transformers' (legacy) Llama tokenizer: "a<ctl>b" reads "a b".
    EXPECT_EQ(t->decode(t->encode("a<ctl>b", false, true), true), "a b");
}

TEST_F(SentencePiece, TokenizerJsonWinsInAFolderWithBoth) {
    const std::string d = test::scratch_dir("spm_both");
    std::filesystem::copy_file(*dir_ + "/tokenizer.model", d + "/tokenizer.model");
    test::write_text(d + "/tokenizer.json", test::gpt2_style_json(test::byte_vocab(), nlohmann::json::array()).dump());
    EXPECT_EQ(load_tokenizer(d)->kind(), "bpe");
    std::filesystem::remove(d + "/tokenizer.json");
    EXPECT_EQ(load_tokenizer(d)->kind(), "sentencepiece");
}

}  // namespace
}  // namespace kv
