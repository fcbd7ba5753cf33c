// Sharded checkpoints: model.safetensors.index.json must agree exactly with its shards.
#include <gtest/gtest.h>

#include "formats/io/safetensors_index.h"
#include "formats/io/safetensors_write.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

// Two shards: a, b in the first, c in the second.
void write_shards(const test::TempDir& dir) {
    write_safetensors(dir.file(kShard1), {{"a", Tensor::from_f32({2}, {1, 2})}, {"b", Tensor::from_f32({1}, {3})}});
    write_safetensors(dir.file(kShard2), {{"c", Tensor::from_f32({3}, {4, 5, 6})}});
}

std::string index_json(const std::string& weight_map) {
    return R"({"metadata": {"total_size": 24, "format": "pt"}, "weight_map": )" + weight_map + "}";
}

TEST(SafetensorsIndex, LoadsEveryShard) {
    test::TempDir dir;
    write_shards(dir);
    test::write_bytes(dir.file("model.safetensors.index.json"),
                      index_json(str("{\"a\": \"", kShard1, "\", \"b\": \"", kShard1, "\", \"c\": \"", kShard2, "\"}")));
    SafetensorsContents c = load_safetensors_sharded(dir.file("model.safetensors.index.json"));
    ASSERT_EQ(c.tensors.size(), 3u);
    EXPECT_EQ(c.tensors.at("a").to_f32_vector(), (std::vector<float>{1, 2}));
    EXPECT_EQ(c.tensors.at("c").to_f32_vector(), (std::vector<float>{4, 5, 6}));
    EXPECT_EQ(c.metadata.at("total_size"), "24");
    EXPECT_EQ(c.metadata.at("format"), "pt");
}

TEST(SafetensorsIndex, MissingShard) {
    test::TempDir dir;
    write_shards(dir);
    test::write_bytes(dir.file("model.safetensors.index.json"),
                      index_json(str("{\"a\": \"", kShard1, "\", \"b\": \"", kShard1, "\", \"c\": \"model-00003-of-00003.safetensors\"}")));
    std::string msg = error_of([&] { load_safetensors_sharded(dir.file("model.safetensors.index.json")); });
    EXPECT_TRUE(contains_all(msg, {"model.safetensors.index.json", "shard 'model-00003-of-00003.safetensors'", "mapped for 'c'", "does not exist"}));
}

TEST(SafetensorsIndex, NameInTheWrongShard) {
    test::TempDir dir;
    write_shards(dir);
    // c is mapped to the first shard but stored in the second.
    test::write_bytes(dir.file("i.json"), index_json(str("{\"a\": \"", kShard1, "\", \"b\": \"", kShard1, "\", \"c\": \"", kShard1, "\"}")));
    std::string msg = error_of([&] { load_safetensors_sharded(dir.file("i.json")); });
    EXPECT_TRUE(contains_all(msg, {"i.json", "weight_map maps 'c' to shard 'model-00001-of-00002.safetensors', but that shard does not contain it"}));
}

TEST(SafetensorsIndex, TensorNotInTheMapOrStoredTwice) {
    test::TempDir dir;
    write_shards(dir);
    test::write_bytes(dir.file("i.json"), index_json(str("{\"a\": \"", kShard1, "\", \"c\": \"", kShard2, "\"}")));
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors_sharded(dir.file("i.json")); }),
                             {"shard 'model-00001-of-00002.safetensors' contains 'b', which weight_map does not list"}));
    // "a" stored in both shards.
    write_safetensors(dir.file(kShard2), {{"c", Tensor::from_f32({3}, {4, 5, 6})}, {"a", Tensor::from_f32({2}, {0, 0})}});
    test::write_bytes(dir.file("i.json"), index_json(str("{\"a\": \"", kShard1, "\", \"b\": \"", kShard1, "\", \"c\": \"", kShard2, "\"}")));
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors_sharded(dir.file("i.json")); }),
                             {"'a' appears in shard 'model-00002-of-00002.safetensors' but weight_map maps it to 'model-00001-of-00002.safetensors'"}));
}

TEST(SafetensorsIndex, MalformedIndex) {
    auto err = [](const std::string& text) { return error_of([&] { parse_safetensors_index(text, "idx.json"); }); };
    EXPECT_TRUE(contains_all(err("{\"metadata\": {}}"), {"idx.json", "field 'weight_map' is missing"}));
    EXPECT_TRUE(contains_all(err("{\"weight_map\": [\"a\"]}"), {"field 'weight_map' must be an object"}));
    EXPECT_TRUE(contains_all(err("{\"weight_map\": {\"a\": 1}}"), {"weight_map entry for 'a' must be a shard file name, got number 1"}));
    EXPECT_TRUE(contains_all(err("{\"weight_map\": {\"a\": \"x.safetensors\", \"a\": \"y.safetensors\"}}"), {"duplicate key 'a'"}));
    EXPECT_TRUE(contains_all(err("{\"weight_map\": {\"a\": \"../secret\"}}"), {"names shard '../secret'", "plain file name"}));
    EXPECT_TRUE(contains_all(err("{\"weight_map\": {\"a\": \"/etc/passwd\"}}"), {"plain file name"}));
    EXPECT_TRUE(contains_all(err("{\"metadata\": 3, \"weight_map\": {}}"), {"field 'metadata' must be an object"}));
    EXPECT_TRUE(contains_all(err("nope"), {"idx.json", "not valid JSON"}));
    test::TempDir dir;
    EXPECT_TRUE(contains_all(error_of([&] { load_safetensors_sharded(dir.file("absent.json")); }), {"absent.json", "cannot read safetensors index"}));
}

}  // namespace
}  // namespace kv
