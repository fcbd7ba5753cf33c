// Data loaders (reference §12): LongBench v2 prompts byte-exact against the reference format,
// HELMET splits, max_seq_length filtering, the token-length cache (created, reused, recomputed
// when stale), seeded train/val splits, similar-length batches with a resumable order, and the
// message of every error. The tests write their own small files and use the byte tokenizer,
// so a prompt's length is its size in bytes.
//
// Index: [SECTION] helpers  [SECTION] LongBench v2  [SECTION] HELMET
//        [SECTION] splits, target choices  [SECTION] batches
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <unistd.h>

#include "engine/core/error.h"
#include "engine/data/dataset.h"
#include "engine/data/helmet.h"
#include "engine/data/longbench_v2.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ==== [SECTION] helpers ================================================================================

// A fresh folder per test, removed afterwards.
class TempDir {
   public:
    TempDir() {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        path_ = fs::path(::testing::TempDir()) / str("kvlab_data_", ::getpid(), "_", info->test_suite_name(), "_", info->name());
        fs::remove_all(path_);
        fs::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const fs::path& path() const { return path_; }

   private:
    fs::path path_;
};

void write_text(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
}

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

// "what\nHINT hint" of the kv::Error `f` throws; fails the test if it throws nothing.
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return std::string(e.what()) + "\nHINT " + e.hint();
    }
    ADD_FAILURE() << "expected a kv::Error";
    return "";
}

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

std::vector<std::string> ids_of(const std::vector<DataRecord>& recs) {
    std::vector<std::string> v;
    for (const auto& r : recs) v.push_back(r.id);
    return v;
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

// ==== [SECTION] HELMET ==================================================================================

json helmet_instance(const std::string& qid, const std::string& input, const json& output, const std::string& max_length = "8k") {
    return json{{"input", input}, {"output", output}, {"query_id", qid}, {"max_length", max_length}, {"depth", 0.4}};
}

std::string jsonl(const std::vector<json>& v) {
    std::string s;
    for (const auto& o : v) s += o.dump() + "\n";
    return s;
}

HelmetOptions helmet_opts(const TempDir& d, int64_t max_seq_length = 0) {
    HelmetOptions o;
    o.path = d.file("helmet");
    o.dataset_key = "nq";
    o.max_length = "8k";
    o.model_name = "bytes";
    o.max_seq_length = max_seq_length;
    return o;
}

// dev: 4 instances of 10, 40, 20, 30 bytes; eval: 3 of 25, 5, 50 bytes.
void write_helmet(const TempDir& d) {
    write_text(
        d.file("helmet/nq_8k/development.jsonl"),
        jsonl({helmet_instance("q0", std::string(10, 'a'), "Paris"),
               helmet_instance("q1", std::string(40, 'b'), json({"x", "y", "z"})),
               helmet_instance("q2", std::string(20, 'c'), json({"only"})), helmet_instance("q3", std::string(30, 'd'), "")}));
    write_text(d.file("helmet/nq_8k/evaluation.jsonl"), jsonl({helmet_instance("e0", std::string(25, 'e'), "one"),
                                                               helmet_instance("e1", std::string(5, 'f'), json({"u", "v"})),
                                                               helmet_instance("e2", std::string(50, 'g'), "two")}));
}

TEST(HelmetLoader, DevSplitIsForTrainingAndEvalSplitIsTheTestSet) {
    TempDir d;
    write_helmet(d);
    auto tok = make_byte_tokenizer();
    LoadedDataset ds = load_helmet(helmet_opts(d), *tok);
    EXPECT_EQ(ds.num_source_records, 7);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"q0", "q1", "q2", "q3"}));
    EXPECT_EQ(ids_of(ds.test), (std::vector<std::string>{"e0", "e1", "e2"}));
    EXPECT_EQ(tok->decode(ds.dev[1].prompt_ids), std::string(40, 'b'));
    EXPECT_EQ(ds.dev[1].num_tokens, 40);
    EXPECT_EQ(ds.test[2].num_tokens, 50);
    EXPECT_EQ(ds.dev[0].targets, (std::vector<std::string>{"Paris"}));
    EXPECT_EQ(ds.dev[1].targets, (std::vector<std::string>{"x", "y", "z"}));
    EXPECT_EQ(ds.dev[3].targets, (std::vector<std::string>{""}));  // ALCE-style empty output is allowed
    EXPECT_EQ(ds.dev[0].label, -1);
    EXPECT_EQ(ds.dev[0].fields.at("query_id"), "q0");
    EXPECT_EQ(ds.dev[0].fields.at("max_length"), "8k");
    EXPECT_EQ(ds.dev[0].fields.at("depth"), "0.4");  // non-strings kept as JSON text
    EXPECT_EQ(ds.dev[0].fields.count("input"), 0u);
    EXPECT_TRUE(ds.class_token_ids.empty());
}

TEST(HelmetLoader, MaxSeqLengthFiltersBothSplits) {
    TempDir d;
    write_helmet(d);
    auto tok = make_byte_tokenizer();
    LoadedDataset ds = load_helmet(helmet_opts(d, 25), *tok);
    EXPECT_EQ(ids_of(ds.dev), (std::vector<std::string>{"q0", "q2"}));
    EXPECT_EQ(ids_of(ds.test), (std::vector<std::string>{"e0", "e1"}));
}

TEST(HelmetLoader, JsonArrayFilesWork) {
    TempDir d;
    write_text(d.file("helmet/json_kv_16k/development.json"), json::array({helmet_instance("k", "abc", "v", "16k")}).dump());
    write_text(d.file("helmet/json_kv_16k/evaluation.json"), json::array({helmet_instance("k2", "abcd", "w", "16k")}).dump());
    auto tok = make_byte_tokenizer();
    HelmetOptions o = helmet_opts(d);
    o.dataset_key = "json_kv";
    o.max_length = "16k";
    EXPECT_EQ(helmet_split_file(o, "development"), d.file("helmet/json_kv_16k/development.json"));
    LoadedDataset ds = load_helmet(o, *tok);
    EXPECT_EQ(ds.dev[0].num_tokens, 3);
    EXPECT_EQ(ds.test[0].num_tokens, 4);
}

TEST(HelmetLoader, MetadataCacheUsesNestedKeysPerSplitAndIsRecomputedPerSplit) {
    TempDir d;
    write_helmet(d);
    auto tok = make_byte_tokenizer();
    LoadedDataset first = load_helmet(helmet_opts(d), *tok);
    EXPECT_FALSE(first.lengths_from_cache);
    EXPECT_EQ(first.metadata_path, d.file("helmet/helmet_metadata.json"));
    json meta = read_json(first.metadata_path);
    EXPECT_EQ(meta["sequence_lengths"]["nq"]["8k"]["bytes"]["dev"], json({10, 40, 20, 30}));
    EXPECT_EQ(meta["sequence_lengths"]["nq"]["8k"]["bytes"]["eval"], json({25, 5, 50}));

    LoadedDataset second = load_helmet(helmet_opts(d, 20), *tok);
    EXPECT_TRUE(second.lengths_from_cache);
    EXPECT_EQ(ids_of(second.dev), (std::vector<std::string>{"q0", "q2"}));

    // A changed eval file re-measures eval only.
    write_text(d.file("helmet/nq_8k/evaluation.jsonl"), jsonl({helmet_instance("e0", "hello", "one")}));
    LoadedDataset third = load_helmet(helmet_opts(d), *tok);
    EXPECT_FALSE(third.lengths_from_cache);
    ASSERT_EQ(third.notes.size(), 1u) << ::testing::PrintToString(third.notes);
    EXPECT_NE(third.notes[0].find("[\"eval\"]"), std::string::npos) << third.notes[0];
    EXPECT_NE(third.notes[0].find("has 3 lengths for 1 records"), std::string::npos) << third.notes[0];
    meta = read_json(first.metadata_path);
    EXPECT_EQ(meta["sequence_lengths"]["nq"]["8k"]["bytes"]["eval"], json({5}));
    EXPECT_EQ(meta["sequence_lengths"]["nq"]["8k"]["bytes"]["dev"], json({10, 40, 20, 30}));

    // Custom metadata folder.
    HelmetOptions o = helmet_opts(d);
    o.metadata_dir = d.file("cache");
    EXPECT_EQ(load_helmet(o, *tok).metadata_path, d.file("cache/helmet_metadata.json"));
    EXPECT_TRUE(fs::exists(d.file("cache/helmet_metadata.json")));
}

TEST(HelmetLoader, MissingSplitFilesSayWhereToGetThem) {
    TempDir d;
    auto tok = make_byte_tokenizer();
    std::string msg = error_of([&] { load_helmet(helmet_opts(d), *tok); });
    EXPECT_NE(
        msg.find("the development split of 'nq' (8k) is missing; expected '" + d.file("helmet/nq_8k/development.jsonl") + "'"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("load_helmet_dev_eval('nq', max_length='8k')"), std::string::npos) << msg;
    EXPECT_NE(msg.find("never downloads"), std::string::npos) << msg;
    write_text(d.file("helmet/nq_8k/development.jsonl"), jsonl({helmet_instance("q", "in", "out")}));
    msg = error_of([&] { load_helmet(helmet_opts(d), *tok); });
    EXPECT_NE(msg.find("the evaluation split of 'nq' (8k) is missing"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(d.file("helmet/helmet_metadata.json"))) << "nothing tokenized before both files are there";
}

TEST(HelmetLoader, BadOptionsAndFieldsAreNamed) {
    TempDir d;
    write_helmet(d);
    auto tok = make_byte_tokenizer();
    HelmetOptions o = helmet_opts(d);
    o.dataset_key = "squad";
    std::string msg = error_of([&] { load_helmet(o, *tok); });
    EXPECT_NE(msg.find("--data.dataset_key: 'squad' is not a HELMET task; expected one of nq, trivia_qa"), std::string::npos)
        << msg;
    o = helmet_opts(d);
    o.max_length = "4k";
    EXPECT_NE(
        error_of([&] { load_helmet(o, *tok); }).find("'4k' is not a HELMET bucket; expected one of 8k, 16k, 32k, 64k, 128k"),
        std::string::npos);

    auto dev_with = [&](const json& bad) {
        write_text(d.file("helmet/nq_8k/development.jsonl"), jsonl({helmet_instance("ok", "in", "out"), bad}));
        return error_of([&] { load_helmet(helmet_opts(d), *tok); });
    };
    msg = dev_with(helmet_instance("q", "in", 7));
    EXPECT_NE(
        msg.find("'development.jsonl' record 1: field 'output' is a number; expected a string or a non-empty list of strings"),
        std::string::npos)
        << msg;
    msg = dev_with(helmet_instance("q", "in", json::array()));
    EXPECT_NE(msg.find("field 'output' is an empty list"), std::string::npos) << msg;
    msg = dev_with(helmet_instance("q", "in", json({"a", 2})));
    EXPECT_NE(msg.find("field 'output' item 1 is a number"), std::string::npos) << msg;
    json bad = helmet_instance("q", "in", "out");
    bad.erase("input");
    EXPECT_NE(dev_with(bad).find("record 1: field 'input' is missing; expected a string"), std::string::npos);
    bad = helmet_instance("q", "in", "out");
    bad["query_id"] = json::object();
    EXPECT_NE(dev_with(bad).find("field 'query_id' is an object; expected a string"), std::string::npos);
    msg = dev_with(helmet_instance("q", "in", "out", "16k"));
    EXPECT_NE(msg.find("record 1: max_length is '16k'; expected '8k'"), std::string::npos) << msg;
    write_text(d.file("helmet/nq_8k/development.jsonl"), jsonl({helmet_instance("ok", "in", "out")}) + "[1, 2]\n");
    msg = error_of([&] { load_helmet(helmet_opts(d), *tok); });
    EXPECT_NE(msg.find("line 2 is an array; expected an object"), std::string::npos) << msg;
}

// ==== [SECTION] splits, target choices ====================================================================

TEST(DataSplit, SizesFollowTorchRandomSplit) {
    auto sizes = [](int64_t n, double f) {
        TrainValSplit s = split_train_val(n, f, 42);
        return std::make_pair(s.train.size(), s.val.size());
    };
    EXPECT_EQ(sizes(10, 0.1), std::make_pair(size_t(9), size_t(1)));
    EXPECT_EQ(sizes(7, 0.1), std::make_pair(size_t(7), size_t(0)));  // floor 6 / 0, remainder 1 to train
    EXPECT_EQ(sizes(5, 0.5), std::make_pair(size_t(3), size_t(2)));  // 2 / 2, remainder to train
    EXPECT_EQ(sizes(503, 0.1), std::make_pair(size_t(453), size_t(50)));
    EXPECT_EQ(sizes(0, 0.1), std::make_pair(size_t(0), size_t(0)));
    EXPECT_EQ(sizes(4, 0.0), std::make_pair(size_t(4), size_t(0)));
    EXPECT_NE(error_of([] {
                  split_train_val(10, 1.0, 1);
              }).find("--data.val_split_fraction: 1 is out of range; expected a fraction in [0, 1)"),
              std::string::npos);
    EXPECT_NE(error_of([] { split_train_val(10, -0.1, 1); }).find("out of range"), std::string::npos);
}

TEST(DataSplit, ReproducibleFromTheSeedDisjointAndComplete) {
    const int64_t n = 200;
    TrainValSplit a = split_train_val(n, 0.1, 42), b = split_train_val(n, 0.1, 42), c = split_train_val(n, 0.1, 43);
    EXPECT_EQ(a.train, b.train);
    EXPECT_EQ(a.val, b.val);
    EXPECT_NE(a.val, c.val);
    std::set<int64_t> all(a.train.begin(), a.train.end());
    for (int64_t v : a.val) EXPECT_TRUE(all.insert(v).second) << v << " is in both sets";
    EXPECT_EQ((int64_t)all.size(), n);
    EXPECT_EQ(*all.begin(), 0);
    EXPECT_EQ(*all.rbegin(), n - 1);
    // Not the identity: the split is random.
    std::vector<int64_t> sorted_train = a.train;
    std::sort(sorted_train.begin(), sorted_train.end());
    EXPECT_NE(sorted_train, a.train);
}

TEST(DataSplit, JsonRoundTripAndValidation) {
    TrainValSplit s = split_train_val(20, 0.25, 7);
    TrainValSplit r = split_from_json(json::parse(split_to_json(s).dump()), 20);
    EXPECT_EQ(r.train, s.train);
    EXPECT_EQ(r.val, s.val);
    EXPECT_NE(error_of([&] { split_from_json(split_to_json(s), 21); }).find("covers 20 records; the dataset has 21"),
              std::string::npos);
    json j = split_to_json(s);
    j["val_data_index"].push_back(j["train_data_index"][0]);
    EXPECT_NE(error_of([&] { split_from_json(j, 20); }).find("appears twice; expected disjoint sets"), std::string::npos);
    j = split_to_json(s);
    j["train_data_index"][0] = 99;
    EXPECT_NE(error_of([&] { split_from_json(j, 20); }).find("holds 99; expected indices in [0, 20)"), std::string::npos);
    EXPECT_NE(error_of([] {
                  split_from_json(json{{"train_data_index", {0}}}, 1);
              }).find("an index list is missing"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  split_from_json(json{{"train_data_index", "x"}, {"val_data_index", json::array()}}, 1);
              }).find("'train_data_index' is a string"),
              std::string::npos);
}

TEST(DataSplit, SelectRecordsFollowsTheIndices) {
    std::vector<DataRecord> recs(4);
    for (int i = 0; i < 4; ++i) recs[(size_t)i].id = str("r", i);
    EXPECT_EQ(ids_of(select_records(recs, {3, 0})), (std::vector<std::string>{"r3", "r0"}));
    EXPECT_NE(error_of([&] { select_records(recs, {4}); }).find("index 4 is outside [0, 4)"), std::string::npos);
}

TEST(DataTargets, ChoicesAreInRangeAndReproducible) {
    std::vector<DataRecord> recs(50);
    for (size_t i = 0; i < recs.size(); ++i) {
        recs[i].source_index = (int64_t)i;
        recs[i].targets.assign(1 + i % 4, "t");
    }
    recs[7].targets.clear();
    std::vector<int32_t> a = draw_target_choices(recs, 5), b = draw_target_choices(recs, 5), c = draw_target_choices(recs, 6);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    for (size_t i = 0; i < recs.size(); ++i) {
        if (recs[i].targets.empty()) {
            EXPECT_EQ(a[i], -1);
            continue;
        }
        EXPECT_GE(a[i], 0);
        EXPECT_LT(a[i], (int32_t)recs[i].targets.size());
    }
}

// ==== [SECTION] batches ===================================================================================

TEST(DataBatches, SimilarLengthBatchesAscendingWithTheShortRemainderLast) {
    const std::vector<int64_t> len = {50, 10, 40, 20, 30, 60, 70};
    auto b = similar_length_batches(len, 3);
    EXPECT_EQ(b, (std::vector<std::vector<int64_t>>{{1, 3, 4}, {2, 0, 5}, {6}}));
    // Ties keep index order.
    EXPECT_EQ(similar_length_batches({5, 5, 1, 5}, 2), (std::vector<std::vector<int64_t>>{{2, 0}, {1, 3}}));
    EXPECT_EQ(similar_length_batches({3, 1, 2}, 1), (std::vector<std::vector<int64_t>>{{1}, {2}, {0}}));
    EXPECT_TRUE(similar_length_batches({}, 2).empty());
    EXPECT_NE(error_of([] { similar_length_batches({1}, 0); }).find("--train.micro_batch_size: 0 is out of range"),
              std::string::npos);
}

std::vector<int64_t> random_lengths(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> v(n);
    for (auto& x : v) x = 1 + int64_t(rng() % 1000);
    return v;
}

TEST(DataBatches, EveryEpochHandsOutEveryBatchOnce) {
    const auto len = random_lengths(23, 1);
    BatchOrderOptions opt;
    opt.micro_batch_size = 4;
    opt.seed = 3;
    BatchIterator it(len, opt);
    ASSERT_EQ(it.num_batches(), 6);
    std::vector<std::vector<int64_t>> first_epoch;
    for (int epoch = 1; epoch <= 3; ++epoch) {
        std::multiset<int64_t> seen;
        std::vector<std::vector<int64_t>> order;
        for (int k = 0; k < 6; ++k) {
            const auto& b = it.next();
            EXPECT_EQ(it.epoch(), epoch);
            EXPECT_EQ(it.position(), k + 1);
            for (size_t j = 1; j < b.size(); ++j)
                EXPECT_LE(len[(size_t)b[j - 1]], len[(size_t)b[j]]) << "ascending within a batch";
            seen.insert(b.begin(), b.end());
            order.push_back(b);
        }
        EXPECT_EQ(seen.size(), 23u);
        EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 23u);
        if (epoch == 1)
            first_epoch = order;
        else
            EXPECT_NE(order, first_epoch) << "shuffled differently per epoch";
    }
}

TEST(DataBatches, OrderOptions) {
    const auto len = random_lengths(17, 2);
    const auto parts = similar_length_batches(len, 3);  // 6 batches, the last of 2 holds the longest
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;

    opt.shuffle = false;  // validation: ascending, remainder last, same every epoch
    BatchIterator plain(len, opt);
    for (int e = 0; e < 2; ++e)
        for (size_t k = 0; k < parts.size(); ++k) EXPECT_EQ(plain.next(), parts[k]);

    opt.shuffle = true;
    opt.longest_first = true;  // first epoch only
    BatchIterator longest(len, opt);
    EXPECT_EQ(longest.next(), parts.back());
    for (int k = 1; k < 6; ++k) longest.next();
    // From the second epoch on, the order is the plain shuffled one of that epoch.
    opt.longest_first = false;
    BatchIterator shuffled(len, opt);
    for (int k = 0; k < 6; ++k) shuffled.next();
    for (int k = 0; k < 6; ++k) EXPECT_EQ(longest.next(), shuffled.next());
    EXPECT_EQ(longest.permutation(), shuffled.permutation());

    opt.longest_first = false;
    opt.shortest_first = true;  // every epoch
    BatchIterator shortest(len, opt);
    for (int e = 0; e < 3; ++e) {
        EXPECT_EQ(shortest.next(), parts.front()) << "epoch " << e;
        for (int k = 1; k < 6; ++k) EXPECT_NE(shortest.next(), parts.front());
    }

    opt.longest_first = true;
    EXPECT_NE(error_of([&] {
                  BatchIterator both(len, opt);
              }).find("trainloader_longest_first and trainloader_shortest_first are both set"),
              std::string::npos);
    EXPECT_NE(error_of([] { BatchIterator none({}, BatchOrderOptions{}); }).find("no records to iterate over"),
              std::string::npos);
}

TEST(DataBatches, LongestFirstHoldsTheLongestRecords) {
    const auto len = random_lengths(10, 4);
    BatchOrderOptions opt;
    opt.micro_batch_size = 4;
    opt.longest_first = true;
    BatchIterator it(len, opt);
    const auto& first = it.next();  // 10 = 4 + 4 + 2: the remainder holds the two longest
    ASSERT_EQ(first.size(), 2u);
    std::vector<int64_t> sorted = len;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(len[(size_t)first[0]], sorted[8]);
    EXPECT_EQ(len[(size_t)first[1]], sorted[9]);
}

TEST(DataBatches, StateRoundTripResumesWithTheSameBatches) {
    const auto len = random_lengths(31, 5);
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;
    opt.seed = 11;
    opt.longest_first = true;
    for (int steps : {0, 1, 4, 11, 12, 13, 30}) {
        BatchIterator a(len, opt);
        for (int k = 0; k < steps; ++k) a.next();
        const std::string saved = a.state().dump();
        BatchIterator b(len, opt);
        b.restore(json::parse(saved));
        EXPECT_EQ(b.epoch(), a.epoch());
        EXPECT_EQ(b.position(), a.position());
        for (int k = 0; k < 40; ++k) ASSERT_EQ(b.next(), a.next()) << "steps " << steps << ", then " << k;
    }
}

TEST(DataBatches, RestoreRejectsStateOfOtherDataOrOptions) {
    const auto len = random_lengths(12, 6);
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;
    BatchIterator a(len, opt);
    a.next();
    const json state = a.state();

    BatchIterator b(random_lengths(13, 6), opt);  // a different dataset: other batches
    std::string msg = error_of([&] { b.restore(state); });
    EXPECT_NE(msg.find("micro-batches differ"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resume with the same dataset"), std::string::npos) << msg;

    BatchOrderOptions opt2 = opt;
    opt2.micro_batch_size = 4;
    BatchIterator c(len, opt2);
    EXPECT_NE(error_of([&] { c.restore(state); }).find("saved with micro batch size 3, now 4"), std::string::npos);
    opt2 = opt;
    opt2.seed = 1;
    BatchIterator e(len, opt2);
    EXPECT_NE(error_of([&] { e.restore(state); }).find("saved with seed 42, now 1"), std::string::npos);

    BatchIterator f(len, opt);
    json bad = state;
    bad["permutation"] = json({0, 0, 1, 2});
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("do not fit 4 micro-batches"), std::string::npos);
    bad = state;
    bad.erase("position");
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("field 'position' is missing"), std::string::npos);
    bad = state;
    bad["epoch"] = "one";
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("wrong type"), std::string::npos);
}

}  // namespace
}  // namespace kv
