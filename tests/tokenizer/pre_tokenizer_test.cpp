// Pre-tokenizer splits on tricky inputs, compared with splits derived by hand from the regex
// alternatives (the first alternative that matches at a position wins; quantifiers are greedy and
// backtrack). Also the five delimiter behaviours of Hugging Face's Split.
#include <gtest/gtest.h>

#include "formats/tokenizer/byte_level.h"
#include "formats/tokenizer/pre_tokenizer.h"
#include "formats/tokenizer/regex.h"

namespace kv {
namespace {

using Pieces = std::vector<std::string>;

Pieces split_isolated(const char* pattern, const std::string& text) {
    PreTokenizer p;
    PreTokStep s;
    s.regex = shared_regex(pattern);
    p.add(std::move(s));
    Pieces out;
    p.split(text, true, out);
    return out;
}

TEST(PreTokenizer, Gpt2Regex) {
    using pretok_pattern::kGpt2;
    // Contractions are lowercase-only alternatives: "'RE" fails them, so "'" is punctuation
    // (" ?[^\s\p{L}\p{N}]+") and "RE" letters.
    EXPECT_EQ(split_isolated(kGpt2, "I'm don't we'll THEY'RE"),
              (Pieces{"I", "'m", " don", "'t", " we", "'ll", " THEY", "'", "RE"}));
    // Whitespace runs: "\s+(?!\S)" backs off one space so the next word keeps its " ";
    // at the end of text the whole run (here "\n\n") matches.
    EXPECT_EQ(split_isolated(kGpt2, "abc  123   x\n\n"), (Pieces{"abc", " ", " 123", "  ", " x", "\n\n"}));
    // A tab before a letter: " ?\p{L}+" wants a space, "\s+(?!\S)" fails before 'b', so the last
    // alternative "\s+" takes the tab alone.
    EXPECT_EQ(split_isolated(kGpt2, "a\tb"), (Pieces{"a", "\t", "b"}));
    // Digits stay in one group with their space.
    EXPECT_EQ(split_isolated(kGpt2, "(hello) 2024"), (Pieces{"(", "hello", ")", " 2024"}));
}

TEST(PreTokenizer, Qwen2Regex) {
    using pretok_pattern::kQwen2;
    // (?i:'m) takes "'M"; the space before "123" is alone (no alternative joins a space to a digit);
    // digits are single; "\s*[\r\n]+" takes "\n\n" but not the spaces after it.
    EXPECT_EQ(split_isolated(kQwen2, "I'M 123 ok\n\n  x"),
              (Pieces{"I", "'M", " ", "1", "2", "3", " ok", "\n\n", " ", " x"}));
    // "[^\r\n\p{L}\p{N}]?\p{L}+" lets one punctuation mark lead a word: "(hello".
    EXPECT_EQ(split_isolated(kQwen2, "(hello) 2024"), (Pieces{"(hello", ")", " ", "2", "0", "2", "4"}));
    // " ?[^\s\p{L}\p{N}]+[\r\n]*": punctuation keeps the newlines that follow it.
    EXPECT_EQ(split_isolated(kQwen2, "Hello, world!!\n"), (Pieces{"Hello", ",", " world", "!!\n"}));
    EXPECT_EQ(split_isolated(kQwen2, "\n\n\tfoo"), (Pieces{"\n\n", "\tfoo"}));
}

TEST(PreTokenizer, Llama3Regex) {
    using pretok_pattern::kLlama3;
    // Same as Qwen2 except "\p{N}{1,3}": digits in greedy groups of three from the left.
    EXPECT_EQ(split_isolated(kLlama3, "12345 abc"), (Pieces{"123", "45", " abc"}));
    EXPECT_EQ(split_isolated(kLlama3, "(hello) 2024"), (Pieces{"(hello", ")", " ", "202", "4"}));
    EXPECT_EQ(split_isolated(kLlama3, "I'M 123 ok\n\n  x"), (Pieces{"I", "'M", " ", "123", " ok", "\n\n", " ", " x"}));
}

TEST(PreTokenizer, SmolLmDigitsThenByteLevel) {
    // SmolLM2: Digits(individual_digits) isolates every digit, then ByteLevel runs the GPT-2 regex
    // on the rest: "Hello world! " -> "Hello", " world", "!", " " (trailing space at the end).
    PreTokenizer p;
    PreTokStep digits;
    digits.regex = shared_regex(R"(\p{N})");
    p.add(std::move(digits));
    PreTokStep bl;
    bl.kind = PreTokKind::BYTE_LEVEL;
    bl.regex = shared_regex(pretok_pattern::kGpt2);
    p.add(std::move(bl));
    Pieces out;
    p.split("Hello world! 123", true, out);
    Pieces expect;
    for (const char* s : {"Hello", " world", "!", " ", "1", "2", "3"}) expect.push_back(byte_level_encode(s));
    EXPECT_EQ(out, expect);
}

TEST(PreTokenizer, SplitBehaviours) {
    const Regex dash("-");
    auto run = [&](SplitBehavior b, bool invert = false) {
        Pieces out;
        split_by_regex("a-b--c", dash, b, invert, out);
        return out;
    };
    // Spans: a | - | b | - | - | c  (consecutive delimiters are separate matches).
    EXPECT_EQ(run(SplitBehavior::ISOLATED), (Pieces{"a", "-", "b", "-", "-", "c"}));
    EXPECT_EQ(run(SplitBehavior::REMOVED), (Pieces{"a", "b", "c"}));
    // A delimiter joins the piece before it only if that piece is not itself a delimiter.
    EXPECT_EQ(run(SplitBehavior::MERGED_WITH_PREVIOUS), (Pieces{"a-", "b-", "-", "c"}));
    EXPECT_EQ(run(SplitBehavior::MERGED_WITH_NEXT), (Pieces{"a", "-b", "-", "-c"}));
    EXPECT_EQ(run(SplitBehavior::CONTIGUOUS), (Pieces{"a", "-", "b", "--", "c"}));
    // invert: the matches are the words. "\w+" Removed+invert keeps only the words.
    Pieces words;
    split_by_regex("ab, cd!", Regex(R"(\w+)"), SplitBehavior::REMOVED, true, words);
    EXPECT_EQ(words, (Pieces{"ab", "cd"}));
}

TEST(PreTokenizer, MetaspaceReplacesAndSplits) {
    PreTokenizer p;
    PreTokStep m;
    m.kind = PreTokKind::METASPACE;
    m.prepend = PrependScheme::FIRST;
    p.add(std::move(m));
    const std::string S = "\xE2\x96\x81";
    Pieces out;
    p.split("hi there", true, out);  // "▁hi▁there" split before each ▁
    EXPECT_EQ(out, (Pieces{S + "hi", S + "there"}));
    out.clear();
    p.split("x", false, out);  // "first": no prefix for a segment that does not start the text
    EXPECT_EQ(out, (Pieces{"x"}));
}

TEST(PreTokenizer, InvalidUtf8FallsIntoGaps) {
    // PCRE2 never matches invalid bytes; Isolated keeps them as their own piece, so nothing is lost.
    const Pieces out = split_isolated(pretok_pattern::kGpt2, "ab\xFF\xFE cd");
    EXPECT_EQ(out, (Pieces{"ab", "\xFF\xFE", " cd"}));
}

TEST(PreTokenizer, BadRegexNamesThePattern) {
    try {
        Regex r("(unclosed");
        FAIL() << "expected kv::Error";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("(unclosed"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
