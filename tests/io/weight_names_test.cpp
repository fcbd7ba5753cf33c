// The name/shape table per architecture and check_weights' report of missing, mis-shaped,
// non-float and unexpected tensors.
#include <gtest/gtest.h>

#include <map>

#include "formats/io/weight_names.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;

std::map<std::string, WeightSpec> by_name(const ModelConfig& c) {
    std::map<std::string, WeightSpec> m;
    for (const auto& s : expected_weight_shapes(c)) m[s.name] = s;
    return m;
}

TEST(WeightNames, LlamaTable) {
    ModelConfig c = test::tiny_config(Arch::LLAMA);  // V 48, E 32, I 40, NH 4, G 2, HS 8, 2 layers
    auto w = expected_weight_shapes(c);
    EXPECT_EQ(w.size(), 1u + 2u * 9u + 1u + 1u);
    EXPECT_EQ(w.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(w.back().name, "lm_head.weight");
    EXPECT_FALSE(w.back().optional);  // untied
    auto m = by_name(c);
    EXPECT_EQ(m.at("model.embed_tokens.weight").shape, Shape({48, 32}));
    EXPECT_EQ(m.at("model.layers.0.input_layernorm.weight").shape, Shape({32}));
    EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight").shape, Shape({32, 32}));
    EXPECT_EQ(m.at("model.layers.1.self_attn.k_proj.weight").shape, Shape({16, 32}));
    EXPECT_EQ(m.at("model.layers.1.self_attn.v_proj.weight").shape, Shape({16, 32}));
    EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.weight").shape, Shape({32, 32}));
    EXPECT_EQ(m.at("model.layers.0.post_attention_layernorm.weight").shape, Shape({32}));
    EXPECT_EQ(m.at("model.layers.0.mlp.gate_proj.weight").shape, Shape({40, 32}));
    EXPECT_EQ(m.at("model.layers.0.mlp.up_proj.weight").shape, Shape({40, 32}));
    EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.weight").shape, Shape({32, 40}));
    EXPECT_EQ(m.at("model.norm.weight").shape, Shape({32}));
    EXPECT_EQ(m.at("lm_head.weight").shape, Shape({48, 32}));
    EXPECT_EQ(m.count("model.layers.0.self_attn.q_proj.bias"), 0u);
    EXPECT_EQ(m.count("model.layers.2.input_layernorm.weight"), 0u);

    c.qkv_bias = c.o_bias = c.mlp_bias = true;  // Llama with attention_bias / mlp_bias
    m = by_name(c);
    EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.bias").shape, Shape({16}));
    EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.bias").shape, Shape({32}));
    EXPECT_EQ(m.at("model.layers.0.mlp.gate_proj.bias").shape, Shape({40}));
    EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.bias").shape, Shape({32}));
}

TEST(WeightNames, Qwen2BiasesAndQwen3Norms) {
    auto q2 = by_name(test::tiny_config(Arch::QWEN2));
    EXPECT_EQ(q2.at("model.layers.0.self_attn.q_proj.bias").shape, Shape({32}));
    EXPECT_EQ(q2.at("model.layers.0.self_attn.k_proj.bias").shape, Shape({16}));
    EXPECT_EQ(q2.at("model.layers.0.self_attn.v_proj.bias").shape, Shape({16}));
    EXPECT_EQ(q2.count("model.layers.0.self_attn.o_proj.bias"), 0u);
    EXPECT_TRUE(q2.at("lm_head.weight").optional);  // tied

    auto q3 = by_name(test::tiny_config(Arch::QWEN3));  // head_dim 16 != 32 / 4
    EXPECT_EQ(q3.at("model.layers.0.self_attn.q_proj.weight").shape, Shape({64, 32}));
    EXPECT_EQ(q3.at("model.layers.0.self_attn.k_proj.weight").shape, Shape({32, 32}));
    EXPECT_EQ(q3.at("model.layers.0.self_attn.o_proj.weight").shape, Shape({32, 64}));
    EXPECT_EQ(q3.at("model.layers.1.self_attn.q_norm.weight").shape, Shape({16}));
    EXPECT_EQ(q3.at("model.layers.1.self_attn.k_norm.weight").shape, Shape({16}));
    EXPECT_EQ(q3.count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

// gpt-oss attention: a sink logit per query head in every layer, biases on q/k/v and o_proj.
TEST(WeightNames, GptOssSinksAndBiases) {
    const ModelConfig c = test::tiny_config(Arch::GPT_OSS);  // NH 4
    auto m = by_name(c);
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
        EXPECT_EQ(m.at(p + "sinks").shape, Shape({4})) << l;
        EXPECT_FALSE(m.at(p + "sinks").optional) << l;
        EXPECT_EQ(m.at(p + "o_proj.bias").shape, Shape({32})) << l;
        EXPECT_EQ(m.at(p + "q_proj.bias").shape, Shape({32})) << l;
    }
    EXPECT_EQ(by_name(test::tiny_config(Arch::LLAMA)).count("model.layers.0.self_attn.sinks"), 0u);
}

TEST(WeightNames, Gpt2Table) {
    auto g = by_name(test::tiny_config(Arch::GPT2));
    EXPECT_EQ(g.at("wte.weight").shape, Shape({48, 32}));
    EXPECT_EQ(g.at("wpe.weight").shape, Shape({64, 32}));
    EXPECT_EQ(g.at("h.0.attn.c_attn.weight").shape, Shape({32, 96}));  // Conv1D [in, out]
    EXPECT_EQ(g.at("h.0.attn.c_attn.bias").shape, Shape({96}));
    EXPECT_EQ(g.at("h.1.mlp.c_fc.weight").shape, Shape({32, 40}));
    EXPECT_EQ(g.at("h.1.mlp.c_proj.weight").shape, Shape({40, 32}));
    EXPECT_EQ(g.at("ln_f.bias").shape, Shape({32}));
    EXPECT_EQ(g.size(), 2u + 2u * 12u + 2u + 1u);
}

TEST(WeightNames, CompleteWeightsPass) {
    for (Arch a : {Arch::LLAMA, Arch::MISTRAL, Arch::QWEN2, Arch::QWEN3, Arch::GPT2}) {
        ModelConfig c = test::tiny_config(a);
        TensorMap w = test::tiny_weights(c, DType::BF16, 1);
        WeightCheck r = check_weights(c, w);
        EXPECT_TRUE(r.ok()) << arch_name(a) << ": " << r.report();
        // A tied checkpoint may still carry lm_head.weight.
        w["lm_head.weight"] = Tensor::zeros({48, 32}, DType::BF16);
        EXPECT_TRUE(check_weights(c, w).ok()) << arch_name(a);
    }
}

TEST(WeightNames, MissingTensor) {
    ModelConfig c = test::tiny_config(Arch::LLAMA);
    TensorMap w = test::tiny_weights(c, DType::F32, 2);
    w.erase("model.layers.1.mlp.up_proj.weight");
    WeightCheck r = check_weights(c, w);
    ASSERT_EQ(r.missing.size(), 1u);
    EXPECT_EQ(r.missing[0], "model.layers.1.mlp.up_proj.weight (expected (40, 32))");
    std::string msg = error_of([&] { require_weights(c, w, "dir/model.safetensors"); });
    EXPECT_TRUE(contains_all(msg, {"dir/model.safetensors", "weights do not match the llama config", "1 missing: model.layers.1.mlp.up_proj.weight (expected (40, 32))"}));
    // Untied: lm_head.weight is required.
    w = test::tiny_weights(c, DType::F32, 2);
    w.erase("lm_head.weight");
    EXPECT_TRUE(contains_all(check_weights(c, w).report(), {"1 missing: lm_head.weight (expected (48, 32))"}));
}

TEST(WeightNames, MisshapedTensor) {
    ModelConfig c = test::tiny_config(Arch::QWEN3);
    TensorMap w = test::tiny_weights(c, DType::F32, 3);
    w["model.layers.0.self_attn.q_proj.weight"] = Tensor::zeros({32, 32}, DType::F32);  // hidden/heads·heads, not head_dim·heads
    w["model.layers.1.self_attn.k_norm.weight"] = Tensor::zeros({16, 1}, DType::F32);
    std::string msg = error_of([&] { require_weights(c, w, "m.safetensors"); });
    EXPECT_TRUE(contains_all(msg, {"m.safetensors", "2 with the wrong shape",
                                   "model.layers.0.self_attn.q_proj.weight: expected (64, 32), got (32, 32)",
                                   "model.layers.1.self_attn.k_norm.weight: expected (16,), got (16, 1)"}));
}

TEST(WeightNames, UnexpectedAndNonFloatTensors) {
    ModelConfig c = test::tiny_config(Arch::MISTRAL);
    TensorMap w = test::tiny_weights(c, DType::F16, 4);
    w["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor::zeros({4}, DType::F32);
    w["model.layers.2.input_layernorm.weight"] = Tensor::zeros({32}, DType::F32);  // a third layer
    w["model.norm.weight"] = Tensor::zeros({32}, DType::I32);
    WeightCheck r = check_weights(c, w);
    EXPECT_EQ(r.unexpected, (std::vector<std::string>{"model.layers.0.self_attn.rotary_emb.inv_freq", "model.layers.2.input_layernorm.weight"}));
    ASSERT_EQ(r.bad_dtype.size(), 1u);
    EXPECT_TRUE(contains_all(r.bad_dtype[0], {"model.norm.weight: dtype I32"}));
    EXPECT_TRUE(contains_all(r.report(), {"2 unexpected: model.layers.0.self_attn.rotary_emb.inv_freq", "1 with a non-float dtype"}));
}

TEST(WeightNames, LongListsAreCut) {
    ModelConfig c = test::tiny_config(Arch::LLAMA);
    c.num_layers = 8;
    WeightCheck r = check_weights(c, {});
    EXPECT_EQ(r.missing.size(), 1u + 8u * 9u + 2u);
    EXPECT_TRUE(contains_all(r.report(), {"75 missing: model.embed_tokens.weight", "... and 65 more"}));
}

TEST(WeightNames, Gpt2MaskBuffersAreNotWeights) {
    ModelConfig c = test::tiny_config(Arch::GPT2);
    TensorMap w = test::tiny_weights(c, DType::F32, 5);
    w["h.0.attn.bias"] = Tensor::zeros({1, 1, 64, 64}, DType::U8);
    w["h.1.attn.masked_bias"] = Tensor::zeros({}, DType::F32);
    EXPECT_TRUE(check_weights(c, w).ok()) << check_weights(c, w).report();
}

}  // namespace
}  // namespace kv
