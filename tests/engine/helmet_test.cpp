// HELMET loader (engine/data/helmet): dev/eval splits, max_seq_length filtering, the per-split
// token-length cache and the message of every error. Byte tokenizer: length = bytes.
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

}  // namespace
}  // namespace kv
