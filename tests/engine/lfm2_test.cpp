// LFM2 (Liquid AI): layers of gated short convolutions beside attention layers. The fixture
// lfm2_hybrid (tools/reference/lfm2_reference.py: conv, attention, conv, attention; GQA 4/2)
// against transformers' own Lfm2 classes (transformers.safetensors, float64), whole and in
// chunks that split the convolution's window; the config reading (layer_types, full_attn_idxs,
// Liquid's keys, the MLP width rule); the state the cache keeps for a convolution layer in place
// of a token cache; and what is refused by name.
#include <gtest/gtest.h>

#include <string>

#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/model/transformer_backward.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/support/test_support.h"
#include "tests/engine/chunked_logits_util.h"

namespace kv {
namespace {

std::string fixture_dir() { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/lfm2_hybrid"; }

TEST(Lfm2Fixture, MatchesTransformersLfm2Code) {
    const HfModelFolder f = load_hf_model_folder(fixture_dir());
    const SafetensorsContents expected = load_safetensors(fixture_dir() + "/expected.safetensors");
    const SafetensorsContents hf = load_safetensors(fixture_dir() + "/transformers.safetensors");
    ModelOptions opt;
    Transformer model(f.config, f.weights, opt);
    model.set_context_width(128);
    for (int j = 0; j < 2; ++j) {
        const Tensor& ids = expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = hf.tensors.at("logits." + std::to_string(j));
        const int64_t T = ids.size(1), V = want.size(2);
        for (int64_t chunk : {T, int64_t(1), int64_t(2), int64_t(7), int64_t(32)}) {
            SCOPED_TRACE(str("input ", j, " chunk ", chunk));
            test::Comparison c = test::compare(test::chunked_logits(model, f.config, ids, chunk, V), want);
            EXPECT_FALSE(c.nonfinite_mismatch) << c.report;
            EXPECT_LE(c.rel_err, 1e-5) << c.report;
        }
    }
}

// The convolution's state is what the next chunk needs and nothing else: after a chunk the
// cache holds (B, L - 1, E) values per convolution layer in the activation dtype, no tokens in
// those layers' caches, and every position in the attention layers' (dense).
TEST(Lfm2Fixture, ConvLayersKeepStateAttentionLayersKeepTokens) {
    const HfModelFolder f = load_hf_model_folder(fixture_dir());
    const SafetensorsContents expected = load_safetensors(fixture_dir() + "/expected.safetensors");
    ModelOptions opt;
    Transformer model(f.config, f.weights, opt);
    model.set_context_width(128);
    const Tensor& ids = expected.tensors.at("input_ids.0");  // (2, 13)
    const int64_t B = ids.size(0), T = ids.size(1), E = f.config.hidden_size;
    KVCacheConfig kc;
    KVCache cache(kc, f.config, Device{}, DType::F32, T);
    (void)test::chunked_logits(model, f.config, ids, 5, expected.tensors.at("logits.0").size(2), &cache);
    for (int l = 0; l < 4; ++l) {
        SCOPED_TRACE(str("layer ", l));
        const bool conv = l % 2 == 0;
        EXPECT_EQ(f.config.has_kv_cache(l), !conv);
        LayerState* st = cache.layer_state(l);
        ASSERT_EQ(st != nullptr, conv);
        if (conv) {
            EXPECT_EQ(st->next_pos, T);
            EXPECT_EQ(st->values.shape(), (Shape{B, 2, E}));
            EXPECT_EQ(cache.layer(l).buffer().bytes(), 0u);
        } else {
            EXPECT_GT(cache.layer(l).buffer().bytes(), 0u);
        }
    }
    EXPECT_EQ(cache.state_bytes(), size_t(2 * B * 2 * E * 4));
    cache.reset();
    EXPECT_EQ(cache.state_bytes(), 0u);
}

TEST(Lfm2Fixture, ConvLayerWithoutStateRefusesALaterPosition) {
    const HfModelFolder f = load_hf_model_folder(fixture_dir());
    ModelOptions opt;
    Transformer model(f.config, f.weights, opt);
    model.set_context_width(128);
    PlainAttention plain;
    const Tensor x = model.embed(Tensor::from_i64({1, 3}, {1, 2, 3}));
    try {
        (void)model.block(0, x, 5, plain);
        FAIL() << "a short convolution continued without its state";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layer 0 (short convolution) continues at position 5"), std::string::npos) << e.what();
    }
    // The reverse pass likewise: past position 0 a chunk's gradient must reach the chunk
    // before through the state, which a backward without a state-gradient slot cannot carry.
    struct NoStateBackward final : AttentionBackward {
        void backward(int, const Tensor&, const Tensor&, float, Tensor&, Tensor&, Tensor&) override {}
    } nostate;
    BlockActivations save;
    const Tensor out = model.block(0, x, 0, plain, &save);
    EXPECT_TRUE(save.conv_u.defined() && save.conv_y.defined());
    EXPECT_EQ(save.conv_u.size(1), 2 + 3);  // the state's conv_L_cache - 1 = 2 positions, then the chunk's 3
    try {
        (void)block_backward(model, 0, x, save, out, 5, nostate, nullptr);
        FAIL() << "a short convolution's reverse pass past position 0 dropped the state's gradient";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layer 0 (short convolution): the reverse pass of a chunk at position 5"), std::string::npos)
            << e.what();
    }
}

// Evicting policies run on the attention layers only: with 8 slots, h2o and snapkv keep 8
// positions in layers 1 and 3 while the convolution layers' caches stay empty; layer 0 (before
// any attention) must carry exactly the dense run's state, and while the sequence fits in the
// slots (the first two chunks of 4) the logits equal the dense cache's.
TEST(Lfm2Fixture, EvictingPoliciesActOnAttentionLayersOnly) {
    const HfModelFolder f = load_hf_model_folder(fixture_dir());
    const SafetensorsContents expected = load_safetensors(fixture_dir() + "/expected.safetensors");
    ModelOptions opt;
    Transformer model(f.config, f.weights, opt);
    model.set_context_width(128);
    const Tensor& ids = expected.tensors.at("input_ids.1");  // (1, 37)
    const Tensor& want = expected.tensors.at("logits.1");
    const int64_t T = ids.size(1), V = want.size(2);
    KVCacheConfig dense_cfg;
    KVCache dense(dense_cfg, f.config, Device{}, DType::F32, T);
    (void)test::chunked_logits(model, f.config, ids, 4, V, &dense);
    for (const char* name : {"h2o-default", "snapkv-default"}) {
        SCOPED_TRACE(name);
        KVCacheConfig kc;
        kc.name = name;
        kc.cache_length = 8;
        KVCache cache(kc, f.config, Device{}, DType::F32, T);
        const Tensor got = test::chunked_logits(model, f.config, ids, 4, V, &cache);
        // the first 8 positions (<= 8 slots) saw every key
        test::Comparison first = test::compare(got.slice(1, 0, 8).contiguous(), want.slice(1, 0, 8).contiguous());
        EXPECT_LE(first.rel_err, 1e-5) << first.report;
        // later positions attend over 8 of up to 37 keys: not the reference any more
        test::Comparison all = test::compare(got, want);
        EXPECT_GT(all.rel_err, 1e-3) << "eviction changed nothing";
        for (int l = 0; l < 4; ++l) {
            const std::vector<int32_t>& pos = cache.layer(l).policy().token_positions();
            int64_t held = 0;
            for (int32_t p : pos) held += p >= 0;
            if (l % 2 == 0) {
                EXPECT_EQ(held, 0) << "layer " << l;
                EXPECT_EQ(cache.layer(l).buffer().bytes(), 0u) << "layer " << l;
            } else {
                EXPECT_EQ(held, 8 * f.config.num_kv_heads) << "layer " << l;
            }
        }
        const std::vector<double> s0 = cache.layer_state(0)->values.to_f64_vector(), d0 = dense.layer_state(0)->values.to_f64_vector();
        EXPECT_EQ(s0, d0);
        EXPECT_NE(cache.layer_state(2)->values.to_f64_vector(), dense.layer_state(2)->values.to_f64_vector());
    }
}

std::string lfm2_json(const std::string& extra) {
    return R"({"model_type": "lfm2", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "max_position_embeddings": 128)" + extra + "}";
}

TEST(Lfm2Config, FixtureLayersAndWidths) {
    const ModelConfig c = read_hf_model_config(fixture_dir());
    EXPECT_EQ(c.arch, Arch::LFM2);
    EXPECT_EQ(c.intermediate_size, 48);  // int(2 * 60 / 3) = 40, rounded up to a multiple of 16
    EXPECT_EQ(c.conv_kernel, 3);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    for (int64_t l = 0; l < 4; ++l) {
        EXPECT_EQ(c.short_conv_layer(l), l % 2 == 0) << l;
        EXPECT_EQ(c.layer_spec(l).attention, l % 2 == 0 ? AttnKind::NONE : AttnKind::GLOBAL) << l;
    }
}

TEST(Lfm2Config, LiquidKeysAndFullAttnIdxs) {
    // Liquid's own keys (block_ff_dim, norm_eps, theta, tie_embedding), full_attn_idxs in place of
    // layer_types, a null multiplier (no rounding: int(2 * 100 / 3) = 66)
    const ModelConfig c = parse_model_config(lfm2_json(R"(, "block_ff_dim": 100, "block_ffn_dim_multiplier": null,
        "norm_eps": 1e-6, "theta": 5000.0, "tie_embedding": false, "full_attn_idxs": [1, 3], "conv_L_cache": 4)"),
                                             "cfg");
    EXPECT_EQ(c.intermediate_size, 66);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.conv_kernel, 4);
    for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(c.short_conv_layer(l), l % 2 == 0) << l;
    // the multiplier and rounding: int(2 * 300 / 3) = 200, * 1.5 = 300, up to 256 -> 512
    const ModelConfig m = parse_model_config(lfm2_json(R"(, "intermediate_size": 300, "block_ffn_dim_multiplier": 1.5,
        "block_multiple_of": 256)"), "cfg");
    EXPECT_EQ(m.intermediate_size, 512);
    EXPECT_FALSE(m.short_conv_layer(0));  // neither list: every layer attends (Lfm2Config's default)
    const ModelConfig plain = parse_model_config(lfm2_json(R"(, "intermediate_size": 48, "block_auto_adjust_ff_dim": false)"), "cfg");
    EXPECT_EQ(plain.intermediate_size, 48);
}

TEST(Lfm2Config, RefusalsNameTheField) {
    auto refused = [](const std::string& extra, const char* needle) {
        try {
            (void)parse_model_config(lfm2_json(R"(, "intermediate_size": 48)" + extra), "cfg");
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
            return;
        }
        ADD_FAILURE() << "accepted " << extra;
    };
    refused(R"(, "conv_bias": true)", "conv_bias");
    refused(R"(, "layer_types": ["conv", "mamba", "conv", "full_attention"])", "entry 1 is string \"mamba\"; expected \"full_attention\" or \"conv\"");
    refused(R"(, "layer_types": ["conv"])", "expected a list of 4 strings");
    refused(R"(, "full_attn_idxs": [0, 7])", "full_attn_idxs");
    refused(R"(, "conv_L_cache": 0)", "conv_L_cache");
}

TEST(Lfm2Preset, TinyLfm2RunsAndHoldsStateInItsConvLayers) {
    const ModelConfig c = preset_config("tiny-lfm2");
    ASSERT_EQ(c.num_layers, 6);
    for (int64_t l = 0; l < 6; ++l) EXPECT_EQ(c.has_kv_cache(l), l == 2 || l == 5) << l;
    ModelOptions opt;
    Transformer model(c, random_weights(c, 7, DType::F32, Device{}), opt);
    model.set_context_width(64);
    std::vector<int64_t> id(40);
    for (size_t i = 0; i < id.size(); ++i) id[i] = int64_t(32 + (i * 7) % 90);
    const Tensor ids = Tensor::from_i64({1, 40}, id);
    const Tensor whole = model.forward(ids);
    const Tensor chunked = test::chunked_logits(model, c, ids, 7, whole.size(2));
    test::Comparison cmp = test::compare(chunked, whole);
    EXPECT_LE(cmp.rel_err, 1e-5) << cmp.report;
}

}  // namespace
}  // namespace kv
