// Bad tokenizer input gives one kv::Error naming the file and the problem — malformed JSON,
// missing or unsupported parts, merges that do not fit the vocab, missing files, corrupt
// SentencePiece models — never a crash or a silently wrong tokenizer.
#include <gtest/gtest.h>

#include <random>

#include "engine/core/error.h"
#include "tests/support/test_support.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using nlohmann::json;

// Loads `content` as <dir>/tokenizer.json and expects a kv::Error mentioning the file and `needle`.
void expect_json_error(const std::string& name, const std::string& content, const std::string& needle) {
    const std::string dir = test::scratch_dir(name);
    const std::string file = dir + "/tokenizer.json";
    test::write_text(file, content);
    try {
        load_tokenizer(dir);
        ADD_FAILURE() << name << ": expected kv::Error containing \"" << needle << "\"";
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(file), std::string::npos) << name << ": message does not name the file: " << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << name << ": " << msg;
    }
}

json small(const json& merges) {
    return test::gpt2_style_json(json{{"a", 0}, {"b", 1}, {"ab", 2}}, merges);
}

TEST(TokenizerErrors, MalformedTokenizerJson) {
    expect_json_error("not_json", "{ \"model\": [1, 2", "not valid JSON");
    expect_json_error("not_object", "[1, 2, 3]", "top level: expected a JSON object");
    expect_json_error("no_model", R"({"version": "1.0", "added_tokens": []})", "missing \"model\" object");
    json uni = small(json::array());
    uni["model"]["type"] = "Unigram";
    expect_json_error("unigram", uni.dump(), "model type \"Unigram\" is not supported (expected \"BPE\"");
    expect_json_error("merge_unknown", small(json::array({"a zz"})).dump(),
                      "merge #0 (\"a\", \"zz\") refers to \"zz\", which is not in the vocab");
    expect_json_error("merge_result", small(json::array({"b a"})).dump(),
                      "merge #0 (\"b\", \"a\") produces \"ba\", which is not in the vocab");
    expect_json_error("merge_format", small(json::array({"a b", "ab"})).dump(),
                      "model.merges[1]: \"ab\" is not two tokens separated by one space");
    expect_json_error("merge_pair", small(json::array({json::array({"a"})})).dump(),
                      "model.merges[0]: expected \"a b\" or [\"a\", \"b\"]");
    json vocab_bad = small(json::array());
    vocab_bad["model"]["vocab"]["c"] = "three";
    expect_json_error("vocab_id", vocab_bad.dump(), "token \"c\" has a non-integer id");
    json pre = small(json::array());
    pre["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
    expect_json_error("pre_type", pre.dump(), "pre_tokenizer: pre-tokenizer type \"BertPreTokenizer\" is not supported");
    json split = small(json::array());
    split["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    expect_json_error("bad_regex", split.dump(), "does not compile");
    json behaviour = small(json::array());
    behaviour["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
    expect_json_error("behaviour", behaviour.dump(), "split behavior \"Sideways\" is not known");
    json added = small(json::array());
    added["added_tokens"] = json::array({{{"content", "<x>"}}});
    expect_json_error("added_id", added.dump(), "added_tokens[0]: expected an object with an integer \"id\"");
    json huge = small(json::array());
    huge["added_tokens"] = json::array({{{"id", 1 << 30}, {"content", "<x>"}}});
    expect_json_error("added_huge", huge.dump(), "expected an object with an integer \"id\" in 0..16777215");
    json strip = small(json::array());
    strip["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", "one"}, {"stop", 0}};
    expect_json_error("wrong_type", strip.dump(), "unexpected JSON value");
    json norm = small(json::array());
    norm["normalizer"] = {{"type", "BertNormalizer"}};
    expect_json_error("normalizer", norm.dump(), "normalizer type \"BertNormalizer\" is not supported");
}

TEST(TokenizerErrors, InMemoryJsonNamesItsSource) {
    try {
        parse_tokenizer_json("{", "embedded.json");
        ADD_FAILURE() << "expected kv::Error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("embedded.json: not valid JSON"), std::string::npos) << e.what();
    }
    EXPECT_EQ(parse_tokenizer_json(small(json::array({"a b"})).dump(), "mem")->encode("ab", false),
              (std::vector<int32_t>{2}));
}

TEST(TokenizerErrors, MutatedJsonLoadsOrThrowsKvError) {
    // A poor man's fuzzer: random byte edits of a valid file must either load (and then encode and
    // decode without crashing) or throw kv::Error — never another exception type.
    json base = small(json::array({"a b"}));
    base["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
    base["added_tokens"] = json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}}});
    base["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteLevel"}},
                                                                       {{"type", "Strip"}, {"content", " "},
                                                                        {"start", 1}, {"stop", 0}}})}};
    const std::string text = base.dump();
    std::mt19937_64 rng(test::seed_for("TokenizerErrors.Mutated"));
    const std::string bytes = "{}[]\":,0123456789-aAbBzZ \\\xC3\xFF";
    int loaded = 0;
    for (int n = 0; n < 400; ++n) {
        std::string m = text;
        for (int k = 1 + int(rng() % 3); k > 0; --k) {
            const size_t at = rng() % m.size();
            switch (rng() % 3) {
                case 0: m[at] = bytes[rng() % bytes.size()]; break;
                case 1: m.erase(at, 1 + rng() % 4); break;
                default: m.insert(at, 1, bytes[rng() % bytes.size()]); break;
            }
        }
        try {
            auto t = parse_tokenizer_json(m, "mutant.json");
            ++loaded;
            const auto ids = t->encode("ab <s> a\xC3\xA9" "b", true);
            (void)t->decode(ids, true);
        } catch (const Error&) {
        }
    }
    std::printf("[ info ] %d of 400 mutated tokenizer.json files still loaded\n", loaded);
}

TEST(TokenizerErrors, MissingAndCorruptFiles) {
    const std::string dir = test::scratch_dir("missing");
    auto expect_error = [](const std::string& path, const std::string& needle) {
        try {
            load_tokenizer(path);
            ADD_FAILURE() << "expected kv::Error for " << path;
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(path), std::string::npos) << msg;
            EXPECT_NE(msg.find(needle), std::string::npos) << msg;
            EXPECT_FALSE(e.hint().empty()) << msg;
        }
    };
    expect_error(dir + "/nowhere", "does not exist");
    expect_error(dir, "no tokenizer.json or tokenizer.model in this folder");
    test::write_text(dir + "/tokenizer.model", "this is not a protobuf");
    expect_error(dir, "not a valid SentencePiece model");
}

}  // namespace
}  // namespace kv
