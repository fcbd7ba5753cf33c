// LongBench v2 loader (engine/data/longbench_v2, reference §12): prompts byte-exact against the
// reference format, max_seq_length filtering, the token-length cache (created, reused,
// recomputed when stale) and the message of every error. The byte tokenizer makes a prompt's
// length its size in bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>

#include "data_test_util.h"
#include "engine/core/error.h"
#include "engine/data/dataset.h"
#include "engine/data/helmet.h"
#include "engine/data/longbench_v2.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

using namespace data_test;

// ---- LongBench v2 fixtures ------------------------------------------------------------------------------------

json lb_record(const std::string& id, const std::string& context, const std::string& answer, const std::string& q = "Which?") {
    return json{{"_id", id},
                {"domain", "Single-Document QA"},
                {"sub_domain", "Academic"},
                {"difficulty", "easy"},
                {"length", "short"},
                {"question", q},
                {"choice_A", "alpha"},
                {"choice_B", "beta"},
                {"choice_C", "gamma"},
                {"choice_D", "delta"},
                {"answer", answer},
                {"context", context}};
}

LongBenchV2Fields lb_fields(const json& r) {
    return LongBenchV2Fields{r["question"], {r["choice_A"], r["choice_B"], r["choice_C"], r["choice_D"]}, r["context"]};
}

// Byte tokenizer: prompt length = bytes of the prompt.
int64_t lb_len(const json& r, HeadKind head = HeadKind::NEXT_TOKEN) {
    return (int64_t)longbench_v2_prompt(lb_fields(r), head).size();
}

// Five records with contexts of 100, 300, 200, 500, 400 bytes.
json lb_five() {
    json a = json::array();
    const int sizes[5] = {100, 300, 200, 500, 400};
    for (int i = 0; i < 5; ++i)
        a.push_back(lb_record(str("id", i), std::string((size_t)sizes[i], char('a' + i)), std::string(1, char('A' + i % 4))));
    return a;
}

LongBenchV2Options lb_opts(const TempDir& d, int64_t max_seq_length = 100000) {
    LongBenchV2Options o;
    o.path = d.file("longbench_v2.json");
    o.model_name = "bytes";
    o.max_seq_length = max_seq_length;
    return o;
}

bool any_note_contains(const LoadedDataset& d, const std::string& s) {
    return std::any_of(d.notes.begin(), d.notes.end(), [&](const std::string& n) { return n.find(s) != std::string::npos; });
}

// ==== [SECTION] LongBench v2 ============================================================================

TEST(LongBenchV2Loader, PromptIsTheReferenceFormatForNextTokenPrediction) {
    LongBenchV2Fields f{"What is X?", {"one", "two", "three", "four"}, "The context.\nSecond line."};
    const std::string expected =
        "Please read the following text and answer the question below.\n"
        "\n"
        "<text>\n"
        "The context.\nSecond line.\n"
        "</text>\n"
        "\n"
        "What is the correct answer to this question: What is X?\n"
        "Choices:\n"
        "A: one\n"
        "B: two\n"
        "C: three\n"
        "D: four\n"
        "\n"
        "Format your response as follows: \"The correct answer is (insert answer here)\".\n"
        "\n"
        "Answer:\n"
        "The correct answer is ";
    EXPECT_EQ(longbench_v2_prompt(f, HeadKind::NEXT_TOKEN), expected);
}

TEST(LongBenchV2Loader, PromptIsTheReferenceFormatForClassificationHeads) {
    LongBenchV2Fields f{"Q?", {"a", "b", "c", "d"}, "ctx"};
    const std::string expected =
        "Please read the following text and answer the question below.\n\n<text>\nctx\n</text>\n\n"
        "What is the correct answer to this question: Q?\nChoices:\nA: a\nB: b\nC: c\nD: d\n\n"
        "The correct answer is ";
    EXPECT_EQ(longbench_v2_prompt(f, HeadKind::CLASS_ON_LOGITS), expected);
    EXPECT_EQ(longbench_v2_prompt(f, HeadKind::SEQ_CLASS), expected);
}

TEST(LongBenchV2Loader, LoadsRecordsWithExactPromptsLengthsAndLabels) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump(2));
    auto tok = make_byte_tokenizer();
    for (const char* head : {"next_token_prediction", "seq_classification_on_logits", "seq_classification"}) {
        LongBenchV2Options o = lb_opts(d);
        o.head_model = head;
        LoadedDataset ds = load_longbench_v2(o, *tok);
        const HeadKind hk = head_kind_from_name(head);
        ASSERT_EQ(ds.dev.size(), 5u) << head;
        EXPECT_EQ(ds.num_source_records, 5);
        EXPECT_TRUE(ds.test.empty());
        // Byte tokenizer: "A".."D" are single tokens 65..68, " A" is not a single token.
        EXPECT_EQ(ds.class_token_ids, (std::vector<int32_t>{65, 66, 67, 68}));
        for (size_t i = 0; i < 5; ++i) {
            const DataRecord& r = ds.dev[i];
            EXPECT_EQ(r.id, str("id", i));
            EXPECT_EQ(r.source_index, (int64_t)i);
            EXPECT_EQ(tok->decode(r.prompt_ids), longbench_v2_prompt(lb_fields(data[i]), hk));
            EXPECT_EQ(r.num_tokens, lb_len(data[i], hk));
            EXPECT_EQ(r.num_tokens, (int64_t)r.prompt_ids.size());
            EXPECT_EQ(r.label, int32_t(i % 4));
            EXPECT_EQ(r.targets, (std::vector<std::string>{std::string(1, char('A' + i % 4))}));
            EXPECT_EQ(r.fields.at("difficulty"), "easy");
            EXPECT_EQ(r.fields.at("domain"), "Single-Document QA");
            EXPECT_EQ(r.fields.at("choice_C"), "gamma");
            EXPECT_EQ(r.fields.count("context"), 0u) << "the context is in the prompt, not copied again";
        }
    }
}

TEST(LongBenchV2Loader, KeepsRecordsUpToMaxSeqLengthInclusive) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    // Exactly the length of id2 (context 200): id0 and id2 stay, the rest are dropped.
    LoadedDataset ds = load_longbench_v2(lb_opts(d, lb_len(data[2])), *tok);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"id0", "id2"}));
    EXPECT_TRUE(ds.test.empty());
    ds = load_longbench_v2(lb_opts(d, lb_len(data[2]) - 1), *tok);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"id0"}));
}

TEST(LongBenchV2Loader, RestTestSetHoldsTheLongerRecordsAscending) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d, lb_len(data[2]));
    o.test_set_tag = "rest";
    LoadedDataset ds = load_longbench_v2(o, *tok);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"id0", "id2"}));
    EXPECT_EQ(ids_of(ds.test), (std::vector<std::string>{"id1", "id4", "id3"}));  // contexts 300, 400, 500
    for (const auto& r : ds.test) EXPECT_GT(r.num_tokens, o.max_seq_length);
    EXPECT_EQ(tok->decode(ds.test[2].prompt_ids), longbench_v2_prompt(lb_fields(data[3]), HeadKind::NEXT_TOKEN));
}

TEST(LongBenchV2Loader, DebugNumCasesStopsAfterNKeptRecordsAndWritesNoPartialCache) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d, lb_len(data[2]));
    o.debug_num_cases = 2;
    o.test_set_tag = "rest";
    LoadedDataset ds = load_longbench_v2(o, *tok);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"id0", "id2"}));
    EXPECT_EQ(ids_of(ds.test), (std::vector<std::string>{"id1"})) << "only records seen before the stop";
    EXPECT_FALSE(fs::exists(d.file("longbench_v2_metadata.json")));
    EXPECT_TRUE(any_note_contains(ds, "debug_num_cases: measured 3 of 5 records"));
}

TEST(LongBenchV2Loader, AcceptsJsonLines) {
    TempDir d;
    json data = lb_five();
    std::string lines;
    for (const auto& r : data) lines += r.dump() + "\n\n";  // blank lines are skipped
    write_text(d.file("longbench_v2.json"), lines);
    auto tok = make_byte_tokenizer();
    LoadedDataset ds = load_longbench_v2(lb_opts(d), *tok);
    EXPECT_EQ(ds.dev.size(), 5u);
    EXPECT_EQ(ds.dev[4].num_tokens, lb_len(data[4]));
}

TEST(LongBenchV2Loader, AcceptsAByteOrderMark) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), "\xEF\xBB\xBF" + data.dump());
    auto tok = make_byte_tokenizer();
    EXPECT_EQ(load_longbench_v2(lb_opts(d), *tok).dev.size(), 5u);
}

TEST(LongBenchV2Loader, UnwritableMetadataDirIsANoteNotAnError) {
    TempDir d;
    write_text(d.file("longbench_v2.json"), lb_five().dump());
    write_text(d.file("not_a_dir"), "x");
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d);
    o.metadata_dir = d.file("not_a_dir/meta");
    LoadedDataset ds = load_longbench_v2(o, *tok);
    EXPECT_EQ(ds.dev.size(), 5u);
    EXPECT_TRUE(any_note_contains(ds, "cannot write the metadata file")) << ::testing::PrintToString(ds.notes);
    EXPECT_TRUE(any_note_contains(ds, "lengths will be recomputed next time"));
}

TEST(LongBenchV2Loader, MetadataCacheIsCreatedThenReusedForAnyMaxSeqLength) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    LoadedDataset first = load_longbench_v2(lb_opts(d, lb_len(data[0])), *tok);
    EXPECT_FALSE(first.lengths_from_cache);
    EXPECT_EQ(first.metadata_path, d.file("longbench_v2_metadata.json"));
    // Every record is measured, including the ones this filter drops.
    json meta = read_json(first.metadata_path);
    std::vector<int64_t> expect;
    for (const auto& r : data) expect.push_back(lb_len(r));
    EXPECT_EQ(meta["sequence_lengths"]["bytes"].get<std::vector<int64_t>>(), expect);

    LoadedDataset second = load_longbench_v2(lb_opts(d, lb_len(data[4])), *tok);
    EXPECT_TRUE(second.lengths_from_cache);
    EXPECT_EQ(ids_of(second.dev), (std::vector<std::string>{"id0", "id1", "id2", "id4"}));

    // Proof the cache is read: claim id1 is huge, and it is dropped without being tokenized.
    meta["sequence_lengths"]["bytes"][1] = 1000000;
    write_text(first.metadata_path, meta.dump());
    LoadedDataset third = load_longbench_v2(lb_opts(d, lb_len(data[4])), *tok);
    EXPECT_TRUE(third.lengths_from_cache);
    EXPECT_EQ(ids_of(third.dev), (std::vector<std::string>{"id0", "id2", "id4"}));

    // recompute_lengths ignores it and repairs the entry.
    LongBenchV2Options o = lb_opts(d, lb_len(data[4]));
    o.recompute_lengths = true;
    LoadedDataset fourth = load_longbench_v2(o, *tok);
    EXPECT_FALSE(fourth.lengths_from_cache);
    EXPECT_EQ(ids_of(fourth.dev), (std::vector<std::string>{"id0", "id1", "id2", "id4"}));
    EXPECT_EQ(read_json(first.metadata_path)["sequence_lengths"]["bytes"].get<std::vector<int64_t>>(), expect);
}

TEST(LongBenchV2Loader, MetadataCacheIsRecomputedWhenTheRecordCountChanges) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    load_longbench_v2(lb_opts(d), *tok);
    data.push_back(lb_record("id5", std::string(50, 'z'), "D"));
    write_text(d.file("longbench_v2.json"), data.dump());
    LoadedDataset ds = load_longbench_v2(lb_opts(d), *tok);
    EXPECT_FALSE(ds.lengths_from_cache);
    EXPECT_TRUE(any_note_contains(ds, "has 5 lengths for 6 records")) << ::testing::PrintToString(ds.notes);
    EXPECT_EQ(ds.dev.size(), 6u);
    EXPECT_EQ(read_json(ds.metadata_path)["sequence_lengths"]["bytes"].size(), 6u);
    EXPECT_TRUE(load_longbench_v2(lb_opts(d), *tok).lengths_from_cache);
}

TEST(LongBenchV2Loader, StaleCachedLengthOfAKeptRecordTriggersRecomputation) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    load_longbench_v2(lb_opts(d), *tok);
    json meta = read_json(d.file("longbench_v2_metadata.json"));
    meta["sequence_lengths"]["bytes"][3] = 7;  // wrong, but small enough to be kept
    write_text(d.file("longbench_v2_metadata.json"), meta.dump());
    LoadedDataset ds = load_longbench_v2(lb_opts(d), *tok);
    EXPECT_FALSE(ds.lengths_from_cache);
    EXPECT_TRUE(any_note_contains(ds, "record 3 has 7 tokens but its prompt has")) << ::testing::PrintToString(ds.notes);
    EXPECT_EQ(ds.dev[3].num_tokens, lb_len(data[3]));
    EXPECT_EQ(read_json(d.file("longbench_v2_metadata.json"))["sequence_lengths"]["bytes"][3].get<int64_t>(), lb_len(data[3]));
}

TEST(LongBenchV2Loader, MalformedCacheEntryIsRecomputed) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    auto tok = make_byte_tokenizer();
    for (const json& bad : {json("x"), json(-1), json(2.5)}) {
        write_text(d.file("longbench_v2_metadata.json"), json{{"sequence_lengths", {{"bytes", {1, 2, bad, 4, 5}}}}}.dump());
        LoadedDataset ds = load_longbench_v2(lb_opts(d), *tok);
        EXPECT_FALSE(ds.lengths_from_cache);
        EXPECT_TRUE(any_note_contains(ds, "holds " + bad.dump() + "; expected token counts")) << ::testing::PrintToString(ds.notes);
        EXPECT_EQ(read_json(ds.metadata_path)["sequence_lengths"]["bytes"][2].get<int64_t>(), lb_len(data[2]));
    }
    write_text(d.file("longbench_v2_metadata.json"), R"({"sequence_lengths": {"bytes": {"a": 1}}})");
    EXPECT_TRUE(any_note_contains(load_longbench_v2(lb_opts(d), *tok), "is an object, not a list of lengths"));
}

TEST(LongBenchV2Loader, MetadataIsKeyedByModelAndPromptTailAndKeepsOtherEntries) {
    TempDir d;
    json data = lb_five();
    write_text(d.file("longbench_v2.json"), data.dump());
    write_text(d.file("longbench_v2_metadata.json"), R"({"sequence_lengths": {"other-model": [1, 2, 3, 4, 5]}, "extra": 1})");
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d);
    load_longbench_v2(o, *tok);
    o.head_model = "seq_classification_on_logits";
    load_longbench_v2(o, *tok);
    json meta = read_json(d.file("longbench_v2_metadata.json"));
    EXPECT_EQ(meta["sequence_lengths"]["other-model"], json({1, 2, 3, 4, 5}));
    EXPECT_EQ(meta["extra"], 1);
    EXPECT_EQ(meta["sequence_lengths"]["bytes"][0].get<int64_t>(), lb_len(data[0], HeadKind::NEXT_TOKEN));
    EXPECT_EQ(meta["sequence_lengths"]["bytes#classification"][0].get<int64_t>(), lb_len(data[0], HeadKind::CLASS_ON_LOGITS));
}

TEST(LongBenchV2Loader, MetadataDirOptionAndUnreadableCacheFile) {
    TempDir d;
    write_text(d.file("data/longbench_v2.json"), lb_five().dump());
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d);
    o.path = d.file("data/longbench_v2.json");
    EXPECT_EQ(load_longbench_v2(o, *tok).metadata_path, d.file("data/longbench_v2_metadata.json"));  // default: beside the data
    o.metadata_dir = d.file("meta/nested");
    LoadedDataset ds = load_longbench_v2(o, *tok);
    EXPECT_EQ(ds.metadata_path, d.file("meta/nested/longbench_v2_metadata.json"));
    EXPECT_TRUE(fs::exists(ds.metadata_path));
    // A corrupt cache file is not fatal: it is recomputed and replaced.
    write_text(ds.metadata_path, "{ not json");
    ds = load_longbench_v2(o, *tok);
    EXPECT_FALSE(ds.lengths_from_cache);
    EXPECT_TRUE(any_note_contains(ds, "is not valid JSON")) << ::testing::PrintToString(ds.notes);
    EXPECT_TRUE(load_longbench_v2(o, *tok).lengths_from_cache);
    // No temp files are left behind by the atomic writes.
    for (const auto& e : fs::directory_iterator(d.file("meta/nested")))
        EXPECT_EQ(e.path().filename().string(), "longbench_v2_metadata.json");
}

TEST(LongBenchV2Loader, MissingFileSaysWhereToGetIt) {
    TempDir d;
    auto tok = make_byte_tokenizer();
    const std::string msg = error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    EXPECT_NE(msg.find("data file '" + d.file("longbench_v2.json") + "' does not exist"), std::string::npos) << msg;
    EXPECT_NE(msg.find("THUDM/LongBench-v2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train"), std::string::npos) << msg;
    EXPECT_NE(msg.find("never downloads"), std::string::npos) << msg;
    LongBenchV2Options o = lb_opts(d);
    o.path = "";
    EXPECT_NE(error_of([&] { load_longbench_v2(o, *tok); }).find("no data file given; expected --data.path"), std::string::npos);
}

TEST(LongBenchV2Loader, MalformedJsonNamesFileAndPosition) {
    TempDir d;
    auto tok = make_byte_tokenizer();
    write_text(d.file("longbench_v2.json"), "[{\"_id\": \"x\",\n \"question\": }]");
    std::string msg = error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    EXPECT_NE(msg.find("longbench_v2.json' is not valid JSON"), std::string::npos) << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;
    // JSON Lines: the line number of the bad line.
    write_text(d.file("longbench_v2.json"), lb_record("a", "c", "A").dump() + "\n{oops\n");
    msg = error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    EXPECT_NE(msg.find("line 2 is not valid JSON"), std::string::npos) << msg;
    write_text(d.file("longbench_v2.json"), "[{\"_id\": \"x\"}, 3]");
    msg = error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    EXPECT_NE(msg.find("element 1 is a number; expected an object"), std::string::npos) << msg;
    write_text(d.file("longbench_v2.json"), "  \n");
    msg = error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    EXPECT_NE(msg.find("is empty; expected a JSON array of objects or JSON Lines"), std::string::npos) << msg;
}

TEST(LongBenchV2Loader, WrongFieldTypesAndBadAnswersAreNamed) {
    TempDir d;
    auto tok = make_byte_tokenizer();
    auto load_with = [&](const json& bad) {
        json data = lb_five();
        data.push_back(bad);
        write_text(d.file("longbench_v2.json"), data.dump());
        return error_of([&] { load_longbench_v2(lb_opts(d), *tok); });
    };
    json r = lb_record("bad1", "ctx", "A");
    r["question"] = 42;
    std::string msg = load_with(r);
    EXPECT_NE(msg.find("'longbench_v2.json' record 5 (_id bad1): field 'question' is a number; expected a string"),
              std::string::npos)
        << msg;
    r = lb_record("bad2", "ctx", "A");
    r.erase("choice_C");
    msg = load_with(r);
    EXPECT_NE(msg.find("record 5 (_id bad2): field 'choice_C' is missing; expected a string"), std::string::npos) << msg;
    r = lb_record("bad3", "ctx", "E");
    msg = load_with(r);
    EXPECT_NE(msg.find("record 5 (_id bad3): answer 'E' is not one of A, B, C, D"), std::string::npos) << msg;
    r = lb_record("bad4", "ctx", "a");
    EXPECT_NE(load_with(r).find("answer 'a' is not one of A, B, C, D"), std::string::npos);
    r = lb_record("bad5", "ctx", "A");
    r["context"] = json::array({"x"});
    EXPECT_NE(load_with(r).find("field 'context' is an array; expected a string"), std::string::npos);
    r = lb_record("bad6", "ctx", "A");
    r["difficulty"] = nullptr;
    EXPECT_NE(load_with(r).find("field 'difficulty' is null; expected a string"), std::string::npos);
}

TEST(LongBenchV2Loader, BadOptionsAreNamed) {
    TempDir d;
    write_text(d.file("longbench_v2.json"), lb_five().dump());
    auto tok = make_byte_tokenizer();
    LongBenchV2Options o = lb_opts(d);
    o.test_set_tag = "all";
    EXPECT_NE(
        error_of([&] { load_longbench_v2(o, *tok); }).find("--data.test_set_tag: 'all' is not supported; expected '' or 'rest'"),
        std::string::npos);
    o = lb_opts(d);
    o.head_model = "regression";
    EXPECT_NE(error_of([&] { load_longbench_v2(o, *tok); }).find("regression"), std::string::npos);
    o = lb_opts(d);
    o.model_name = "";
    EXPECT_NE(error_of([&] { load_longbench_v2(o, *tok); }).find("no model name to key the token-length cache"),
              std::string::npos);
    o = lb_opts(d, 0);
    EXPECT_NE(error_of([&] { load_longbench_v2(o, *tok); }).find("--data.max_seq_length: 0 is out of range"), std::string::npos);
    EXPECT_NE(error_of([] { longbench_v2_answer_index("AB", "here"); }).find("here: answer 'AB' is not one of A, B, C, D"),
              std::string::npos);
}

}  // namespace
}  // namespace kv
