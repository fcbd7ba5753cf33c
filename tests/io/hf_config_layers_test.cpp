// config.json of the families whose layers differ (Gemma 3, Gemma 2, SmolLM3) and of Phi-3 and
// OLMo 2: the per-layer description (ModelConfig::layer_spec) against transformers' rules,
// written out in each test, and one message naming the field for each bad value.
#include <gtest/gtest.h>

#include <cmath>

#include "formats/io/hf_config.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;

std::string edit(std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    return text;
}

std::string err(const std::string& text) {
    return error_of([&] { parse_model_config(text, "dir/config.json"); });
}

// google/gemma-3-1b-it's config.json (fields kvlab ignores dropped).
const char* kGemma3_1B = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": null,
  "bos_token_id": 2, "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
  "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
  "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144})";

// Gemma 2 in the shape of google/gemma-2-2b's config.json, soft-capping keys left out.
const char* kGemma2 = R"({
  "architectures": ["Gemma2ForCausalLM"], "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
  "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
  "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
  "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000})";

// SmolLM3 in the shape of HuggingFaceTB/SmolLM3-3B's config.json (no_rope_layers left to the default).
const char* kSmolLM3 = R"({
  "architectures": ["SmolLM3ForCausalLM"], "attention_bias": false, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 11008, "max_position_embeddings": 65536, "model_type": "smollm3",
  "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 5000000.0, "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 128256})";

// Phi-4-mini's shape (LongRoPE added by the test that reads it).
const char* kPhi4Mini = R"({
  "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 24, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 262144, "tie_word_embeddings": true, "vocab_size": 200064})";

const char* kOlmo2 = R"({
  "architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "olmo2", "num_attention_heads": 16,
  "num_hidden_layers": 16, "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 500000,
  "tie_word_embeddings": false, "vocab_size": 100352})";

TEST(HfConfigLayers, Gemma3InterleavesSlidingAndFullLayers) {
    const ModelConfig c = parse_model_config(kGemma3_1B, "config.json");
    EXPECT_EQ(c.arch, Arch::GEMMA3);
    int sliding = 0;
    for (int64_t i = 0; i < 26; ++i) {
        const bool s = (i + 1) % 6 != 0;  // Gemma3TextConfig's layer_types
        sliding += s;
        const LayerSpec l = c.layer_spec(i);
        EXPECT_EQ(l.attention, s ? AttnKind::SLIDING : AttnKind::GLOBAL) << i;
        EXPECT_EQ(c.layer_window(i), s ? 512 : 0) << i;
        EXPECT_EQ(l.rope_theta, s ? 10000.0 : 1000000.0) << i;
        EXPECT_EQ(l.rope_scaled, !s) << i;
    }
    EXPECT_EQ(sliding, 22);
    EXPECT_EQ(c.norm_placement, NormPlacement::BOTH);
    EXPECT_EQ(c.norm_weight_offset, 1.0);
    EXPECT_DOUBLE_EQ(c.embedding_scale, std::sqrt(1152.0));
    EXPECT_DOUBLE_EQ(c.query_scale(), 1.0 / 16.0);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qk_norm_whole);
    EXPECT_EQ(c.mlp_act, MlpAct::GELU_TANH);
    EXPECT_TRUE(c.tie_word_embeddings);  // Gemma's default
    EXPECT_EQ(c.attn_logit_softcap, 0.0);
    EXPECT_EQ(c.final_logit_softcap, 0.0);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
}

TEST(HfConfigLayers, Gemma3ExplicitLayerTypesAndNestedRopeParameters) {
    // transformers v5 nests RoPE by layer type; rope_scaling applies to full layers only.
    std::string types = "[";
    for (int i = 0; i < 26; ++i) types += std::string(i ? ", " : "") + (i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
    types += "]";
    const std::string text = edit(edit(kGemma3_1B, "\"rope_scaling\": null, \"rope_theta\": 1000000,",
                                       "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0, "
                                       "\"rope_theta\": 500000}, \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 20000}},"),
                                  "\"sliding_window_pattern\": 6,", "\"sliding_window_pattern\": 6, \"layer_types\": " + types + ",");
    const ModelConfig c = parse_model_config(text, "config.json");
    EXPECT_EQ(c.rope_scaling.type, "linear");
    EXPECT_EQ(c.rope_scaling.factor, 8.0);
    for (int64_t i = 0; i < 26; ++i) {
        EXPECT_EQ(c.layer_window(i), i % 2 ? 0 : 512) << i;
        EXPECT_EQ(c.layer_spec(i).rope_theta, i % 2 ? 500000.0 : 20000.0) << i;
    }
}

TEST(HfConfigLayers, Gemma2AlternatesAndCapsByDefault) {
    const ModelConfig c = parse_model_config(kGemma2, "config.json");
    for (int64_t i = 0; i < 26; ++i) EXPECT_EQ(c.layer_window(i), (i + 1) % 2 ? 4096 : 0) << i;  // Gemma2Config
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.attn_logit_softcap, 50.0);  // absent: Gemma2Config's defaults
    EXPECT_EQ(c.final_logit_softcap, 30.0);
    const ModelConfig n = parse_model_config(
        edit(kGemma2, "\"head_dim\": 256,", "\"head_dim\": 256, \"attn_logit_softcapping\": null, \"final_logit_softcapping\": null,"),
        "config.json");
    EXPECT_EQ(n.attn_logit_softcap, 0.0);
    EXPECT_EQ(n.final_logit_softcap, 0.0);
}

TEST(HfConfigLayers, SmolLM3NoRopeEveryFourthLayer) {
    const ModelConfig c = parse_model_config(kSmolLM3, "config.json");
    int nope = 0;
    for (int64_t i = 0; i < 36; ++i) {
        const bool rope = (i + 1) % 4 != 0;  // SmolLM3Config's no_rope_layers default
        nope += !rope;
        EXPECT_EQ(c.layer_rope_dims(i), rope ? 128 : 0) << i;
        EXPECT_EQ(c.layer_window(i), 0) << i;
    }
    EXPECT_EQ(nope, 9);
    std::string list = "[";
    for (int i = 0; i < 36; ++i) list += std::string(i ? ", " : "") + (i < 2 ? "0" : "1");
    list += "]";
    const ModelConfig e = parse_model_config(edit(kSmolLM3, "\"rope_theta\"", "\"no_rope_layers\": " + list + ", \"rope_theta\""),
                                             "config.json");
    for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(e.layer_rope_dims(i), i < 2 ? 0 : 128) << i;
    // use_sliding_window windows the NoPE layers (transformers' layer_types for SmolLM3)
    const ModelConfig w = parse_model_config(
        edit(kSmolLM3, "\"use_sliding_window\": false", "\"use_sliding_window\": true, \"sliding_window\": 64"), "config.json");
    for (int64_t i = 0; i < 36; ++i) EXPECT_EQ(w.layer_window(i), (i + 1) % 4 != 0 ? 0 : 64) << i;
}

TEST(HfConfigLayers, Phi3PartialRotaryFusedAndWindowed) {
    const ModelConfig c = parse_model_config(kPhi4Mini, "config.json");
    EXPECT_TRUE(c.fused_projections);
    EXPECT_EQ(c.head_dim, 128);
    for (int64_t i = 0; i < 32; ++i) {
        EXPECT_EQ(c.layer_rope_dims(i), 96) << i;
        EXPECT_EQ(c.layer_window(i), 262144) << i;
    }
    EXPECT_EQ(parse_model_config(edit(kPhi4Mini, "\"sliding_window\": 262144", "\"sliding_window\": null"), "config.json").layer_window(0),
              0);
    // LongRoPE: one factor per rotated pair (96 / 2 = 48), the pretraining length beside it.
    std::string f48 = "[";
    for (int i = 0; i < 48; ++i) f48 += (i ? ", " : "") + std::to_string(1.0 + i / 8.0);
    f48 += "]";
    const ModelConfig lr = parse_model_config(
        edit(kPhi4Mini, "\"rope_theta\": 10000.0",
             "\"rope_theta\": 10000.0, \"original_max_position_embeddings\": 4096, \"rope_scaling\": {\"type\": \"longrope\", "
             "\"long_factor\": " + f48 + ", \"short_factor\": " + f48 + "}"),
        "config.json");
    EXPECT_EQ(lr.rope_scaling.type, "longrope");
    EXPECT_EQ(lr.rope_scaling.original_max_position_embeddings, 4096);
    ASSERT_EQ(lr.rope_scaling.long_factor.size(), 48u);
    EXPECT_DOUBLE_EQ(lr.rope_scaling.long_factor[8], 2.0);
    // Bad input: a factor list of the wrong length, a non-positive factor.
    EXPECT_TRUE(contains_all(err(edit(kPhi4Mini, "\"rope_theta\": 10000.0",
                                      "\"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1.0], "
                                      "\"short_factor\": [1.0]}")),
                             {"dir/config.json", "longrope", "1 short_factor and 1 long_factor", "expected one per rotated channel pair: 48"}));
    EXPECT_TRUE(contains_all(err(edit(kPhi4Mini, "\"rope_theta\": 10000.0",
                                      "\"rope_theta\": 10000.0, \"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [0.0], "
                                      "\"short_factor\": [1.0]}")),
                             {"dir/config.json", "rope_scaling.long_factor", "expected numbers > 0"}));
}

TEST(HfConfigLayers, Olmo2NormsAfterAndQkNormOverTheProjection) {
    const ModelConfig c = parse_model_config(kOlmo2, "config.json");
    EXPECT_EQ(c.norm_placement, NormPlacement::POST);
    EXPECT_TRUE(c.qk_norm && c.qk_norm_whole);
    EXPECT_EQ(c.norm_weight_offset, 0.0);
    EXPECT_EQ(c.layer_window(3), 0);
}

TEST(HfConfigLayers, BadLayerFieldsNameTheField) {
    EXPECT_TRUE(contains_all(err(edit(kGemma3_1B, "\"sliding_window_pattern\": 6", "\"sliding_window_pattern\": 6, \"layer_types\": [\"full_attention\"]")),
                             {"dir/config.json", "field 'layer_types'", "expected a list of 26 strings"}));
    EXPECT_TRUE(contains_all(err(edit(kGemma3_1B, "\"sliding_window_pattern\": 6", "\"sliding_window_pattern\": 0")),
                             {"field 'sliding_window_pattern' is 0; expected a number > 0"}));
    EXPECT_TRUE(contains_all(err(edit(kGemma3_1B, "\"gelu_pytorch_tanh\"", "\"relu\"")),
                             {"field 'hidden_activation' is 'relu'; expected 'gelu_pytorch_tanh'"}));
    EXPECT_TRUE(contains_all(err(edit(kGemma3_1B, "\"query_pre_attn_scalar\": 256", "\"query_pre_attn_scalar\": 0")),
                             {"field 'query_pre_attn_scalar' is 0; expected a number > 0"}));
    EXPECT_TRUE(contains_all(err(edit(kGemma2, "\"head_dim\": 256,", "\"head_dim\": 256, \"attn_logit_softcapping\": -1,")),
                             {"field 'attn_logit_softcapping' is -1; expected a number > 0 or null"}));
    EXPECT_TRUE(contains_all(err(edit(kSmolLM3, "\"rope_theta\"", "\"no_rope_layers\": [1, 0], \"rope_theta\"")),
                             {"field 'no_rope_layers' lists 2 layers; expected num_hidden_layers = 36"}));
}

TEST(HfConfigLayers, WriterRefusesTheReadOnlyFamilies) {
    for (const char* text : {kGemma3_1B, kGemma2, kSmolLM3, kPhi4Mini, kOlmo2}) {
        ModelConfig c = parse_model_config(text, "config.json");
        EXPECT_TRUE(contains_all(error_of([&] { model_config_to_json(c); }), {"writing this family's config.json is not supported"}))
            << arch_name(c.arch);
    }
}

}  // namespace
}  // namespace kv
