// Hugging Face folders: write a complete folder per architecture and load it back; sharded
// folders; tokenizer discovery; every way a folder can be incomplete or inconsistent.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_write.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;

bool same_bytes(const Tensor& a, const Tensor& b) {
    Tensor ca = a.contiguous(), cb = b.contiguous();
    return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

TEST(HfFolder, WriteThenLoadEveryArchitecture) {
    for (Arch a : {Arch::LLAMA, Arch::MISTRAL, Arch::QWEN2, Arch::QWEN3, Arch::GPT2}) {
        test::TempDir dir;
        std::string folder = dir.file("model");
        ModelConfig c = test::tiny_config(a);
        c.dtype = DType::BF16;
        TensorMap w = test::tiny_weights(c, DType::BF16, 10 + uint64_t(a));
        write_hf_model_folder(folder, c, w);
        EXPECT_EQ(test::list_dir(folder), (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));

        HfModelFolder f = load_hf_model_folder(folder);
        EXPECT_EQ(f.config.name, "model");
        EXPECT_EQ(model_config_to_json(f.config), model_config_to_json(c)) << arch_name(a);
        ASSERT_EQ(f.weights.size(), w.size()) << arch_name(a);
        for (const auto& [name, t] : w) EXPECT_TRUE(same_bytes(f.weights.at(name), t)) << name;
        EXPECT_TRUE(f.tokenizer_path.empty());
    }
}

TEST(HfFolder, TokenizerDiscovery) {
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::QWEN2);
    write_hf_model_folder(dir.path(), c, test::tiny_weights(c, DType::F32, 1));
    test::write_bytes(dir.file("tokenizer.model"), "sp");
    EXPECT_EQ(load_hf_model_folder(dir.path()).tokenizer_path, dir.file("tokenizer.model"));
    test::write_bytes(dir.file("tokenizer.json"), "{}");
    EXPECT_EQ(load_hf_model_folder(dir.path()).tokenizer_path, dir.file("tokenizer.json"));  // preferred
}

TEST(HfFolder, ShardedFolder) {
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::LLAMA);
    TensorMap w = test::tiny_weights(c, DType::F32, 2);
    write_hf_model_config(dir.path(), c);
    TensorMap s1, s2;
    std::string map = "{";
    for (const auto& [name, t] : w) {
        bool first = name.find("layers.1.") == std::string::npos;
        (first ? s1 : s2)[name] = t;
        map += str(map.size() > 1 ? "," : "", "\"", name, "\":\"model-0000", first ? 1 : 2, "-of-00002.safetensors\"");
    }
    map += "}";
    write_safetensors(dir.file("model-00001-of-00002.safetensors"), s1);
    write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2);
    test::write_bytes(dir.file("model.safetensors.index.json"), "{\"metadata\":{\"total_size\":0},\"weight_map\":" + map + "}");
    HfModelFolder f = load_hf_model_folder(dir.path());
    ASSERT_EQ(f.weights.size(), w.size());
    for (const auto& [name, t] : w) EXPECT_TRUE(same_bytes(f.weights.at(name), t)) << name;

    // A shard that lost a tensor the index maps to it.
    s2.erase("model.layers.1.mlp.up_proj.weight");
    write_safetensors(dir.file("model-00002-of-00002.safetensors"), s2);
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }),
                             {"model.safetensors.index.json", "'model.layers.1.mlp.up_proj.weight'", "does not contain it"}));
}

TEST(HfFolder, MissingFiles) {
    test::TempDir dir;
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }), {dir.path().c_str(), "no config.json", "Hugging Face model folder"}));
    ModelConfig c = test::tiny_config(Arch::LLAMA);
    write_hf_model_config(dir.path(), c);
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }), {"no model.safetensors or model.safetensors.index.json"}));
}

TEST(HfFolder, WeightsThatDoNotMatchTheConfig) {
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::QWEN3);
    TensorMap w = test::tiny_weights(c, DType::F32, 3);
    write_hf_model_config(dir.path(), c);

    TensorMap missing = w;
    missing.erase("model.layers.0.self_attn.q_norm.weight");
    write_safetensors(dir.file("model.safetensors"), missing);
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }),
                             {"model.safetensors", "1 missing: model.layers.0.self_attn.q_norm.weight (expected (16,))"}));

    TensorMap misshaped = w;
    misshaped["model.embed_tokens.weight"] = Tensor::zeros({32, 48}, DType::F32);
    write_safetensors(dir.file("model.safetensors"), misshaped);
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }),
                             {"model.safetensors", "model.embed_tokens.weight: expected (48, 32), got (32, 48)"}));

    // The writer refuses to produce such a folder in the first place.
    EXPECT_TRUE(contains_all(error_of([&] { write_hf_model_folder(dir.file("out"), c, misshaped); }), {"with the wrong shape"}));
    EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
}

TEST(HfFolder, UnknownArchitectureInFolder) {
    test::TempDir dir;
    test::write_bytes(dir.file("config.json"), R"({"model_type": "mamba", "vocab_size": 10})");
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }),
                             {"config.json", "field 'model_type' is 'mamba', which kvlab does not support"}));
}

TEST(HfFolder, BadGenerationConfigNamesItsFile) {
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::LLAMA);
    write_hf_model_folder(dir.path(), c, test::tiny_weights(c, DType::F32, 4));
    test::write_bytes(dir.file("generation_config.json"), R"({"eos_token_id": [2, 1000]})");
    EXPECT_TRUE(contains_all(error_of([&] { load_hf_model_folder(dir.path()); }),
                             {"generation_config.json", "field 'eos_token_id' is 1000; expected a token id in [0, 48)"}));
}

TEST(HfFolder, Gpt2TransformerPrefixIsStripped) {
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::GPT2);
    TensorMap w = test::tiny_weights(c, DType::F32, 6), prefixed;
    for (const auto& [name, t] : w) prefixed["transformer." + name] = t;
    prefixed["transformer.h.0.attn.bias"] = Tensor::zeros({1, 1, 64, 64}, DType::U8);  // causal-mask buffer
    write_hf_model_config(dir.path(), c);
    write_safetensors(dir.file("model.safetensors"), prefixed);
    HfModelFolder f = load_hf_model_folder(dir.path());
    EXPECT_EQ(f.weights.count("wte.weight"), 1u);
    EXPECT_EQ(f.weights.count("transformer.wte.weight"), 0u);
}

}  // namespace
}  // namespace kv
