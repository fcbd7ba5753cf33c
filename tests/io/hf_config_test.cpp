// config.json / generation_config.json: real configs of each architecture produce the right
// ModelConfig fields; bad files give one message naming file, field and expectation; the
// writer round-trips through the reader.
#include <gtest/gtest.h>

#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "modelio_test_util.h"

namespace kv {
namespace {

using test::contains_all;
using test::error_of;

// Published config.json files (trimmed of fields kvlab ignores only where noted).
const char* kLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

const char* kLlama32_1B_generation = R"({
  "bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.45.0.dev0"})";

const char* kLlama2_7B = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
  "sliding_window": 4096, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})";

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "summary_first_dropout": 0.1, "summary_proj_to_labels": true, "summary_type": "cls_index",
  "summary_use_proj": true, "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
  "vocab_size": 50257})";

// Replaces the first occurrence of `from` (must exist) in a copy of `text`.
std::string edit(std::string text, const std::string& from, const std::string& to) {
    size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) text.replace(at, from.size(), to);
    return text;
}

TEST(HfConfig, Llama32WithLlama3RopeScalingAndTiedEmbeddings) {
    ModelConfig c = parse_model_config(kLlama32_1B, "config.json");
    EXPECT_EQ(c.arch, Arch::LLAMA);
    EXPECT_EQ(c.model_type, "llama");
    EXPECT_EQ(c.vocab_size, 128256);
    EXPECT_EQ(c.hidden_size, 2048);
    EXPECT_EQ(c.intermediate_size, 8192);
    EXPECT_EQ(c.num_layers, 16);
    EXPECT_EQ(c.num_heads, 32);
    EXPECT_EQ(c.num_kv_heads, 8);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.group_size(), 4);
    EXPECT_EQ(c.max_position_embeddings, 131072);
    EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
    EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
    EXPECT_EQ(c.rope_scaling.type, "llama3");
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
    EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
    EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_FALSE(c.mlp_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_EQ(c.sliding_window, 0);
    EXPECT_EQ(c.dtype, DType::BF16);
    EXPECT_EQ(c.bos_token_id, 128000);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001}));
    EXPECT_EQ(c.pad_token_id, -1);

    apply_generation_config(kLlama32_1B_generation, "generation_config.json", c);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
    EXPECT_EQ(c.bos_token_id, 128000);
}

TEST(HfConfig, Llama2DefaultsHeadDimAndRope) {
    ModelConfig c = parse_model_config(kLlama2_7B, "config.json");
    EXPECT_EQ(c.head_dim, 128);  // hidden / heads
    EXPECT_EQ(c.num_kv_heads, 32);
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // absent → LlamaConfig default
    EXPECT_TRUE(c.rope_scaling.type.empty());
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_EQ(c.dtype, DType::F16);
    // Without num_key_value_heads, attention is multi-head.
    ModelConfig mha = parse_model_config(edit(kLlama2_7B, "\"num_key_value_heads\": 32,", ""), "config.json");
    EXPECT_EQ(mha.num_kv_heads, 32);
    ModelConfig biased = parse_model_config(edit(kLlama2_7B, "\"pretraining_tp\": 1", "\"attention_bias\": true, \"mlp_bias\": true"), "c");
    EXPECT_TRUE(biased.qkv_bias && biased.o_bias && biased.mlp_bias);
}

TEST(HfConfig, MistralSlidingWindow) {
    ModelConfig c = parse_model_config(kMistral7B, "config.json");
    EXPECT_EQ(c.arch, Arch::MISTRAL);
    EXPECT_EQ(c.sliding_window, 4096);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_EQ(c.num_kv_heads, 8);
    EXPECT_FALSE(c.qkv_bias);
    ModelConfig v2 = parse_model_config(edit(kMistral7B, "\"sliding_window\": 4096", "\"sliding_window\": null"), "config.json");
    EXPECT_EQ(v2.sliding_window, 0);
    // Absent is MistralConfig's default (4096), not "no window"; every layer is windowed.
    ModelConfig absent = parse_model_config(edit(kMistral7B, "\"sliding_window\": 4096,", ""), "config.json");
    EXPECT_EQ(absent.sliding_window, 4096);
    EXPECT_EQ(c.layer_window(0), 4096);
    EXPECT_EQ(c.layer_window(31), 4096);
    EXPECT_EQ(v2.layer_window(0), 0);
}

TEST(HfConfig, Qwen25HasQkvBiasAndIgnoresUnusedSlidingWindow) {
    ModelConfig c = parse_model_config(kQwen25_05B, "config.json");
    EXPECT_EQ(c.arch, Arch::QWEN2);
    EXPECT_EQ(c.head_dim, 64);  // 896 / 14
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_FALSE(c.o_bias);
    EXPECT_FALSE(c.qk_norm);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
    ModelConfig sw = parse_model_config(edit(kQwen25_05B, "\"use_sliding_window\": false", "\"use_sliding_window\": true"), "c");
    EXPECT_EQ(sw.sliding_window, 32768);
    // transformers' Qwen2Config: layer i is "sliding_attention" iff i >= max_window_layers (24
    // here, = num_hidden_layers, so no layer windows).
    EXPECT_EQ(sw.window_from_layer, 24);
    EXPECT_EQ(sw.layer_window(23), 0);
    std::string on = edit(kQwen25_05B, "\"use_sliding_window\": false", "\"use_sliding_window\": true");
    ModelConfig half = parse_model_config(edit(on, "\"max_window_layers\": 24", "\"max_window_layers\": 10"), "c");
    EXPECT_EQ(half.layer_window(9), 0);
    EXPECT_EQ(half.layer_window(10), 32768);
    EXPECT_EQ(half.layer_window(23), 32768);
    // Absent max_window_layers is Qwen2Config's default, 28.
    EXPECT_EQ(parse_model_config(edit(on, "\"max_window_layers\": 24,", ""), "c").window_from_layer, 28);
    // An explicit layer_types list of that shape gives the first windowed layer ...
    std::string types = "\"layer_types\": [";
    for (int i = 0; i < 24; ++i) types += str(i ? ", " : "", i < 3 ? "\"full_attention\"" : "\"sliding_attention\"");
    types += "], \"max_window_layers\": 24";
    EXPECT_EQ(parse_model_config(edit(on, "\"max_window_layers\": 24", types), "c").window_from_layer, 3);
    // ... and any other pattern is refused by name, not misread.
    std::string alternating = "\"layer_types\": [";
    for (int i = 0; i < 24; ++i) alternating += str(i ? ", " : "", i % 2 ? "\"full_attention\"" : "\"sliding_attention\"");
    alternating += "], \"max_window_layers\": 24";
    try {
        parse_model_config(edit(on, "\"max_window_layers\": 24", alternating), "c");
        ADD_FAILURE() << "alternating layer_types accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layer_types"), std::string::npos) << e.what();
    }
}

TEST(HfConfig, Qwen3ExplicitHeadDimAndQkNorm) {
    ModelConfig c = parse_model_config(kQwen3_06B, "config.json");
    EXPECT_EQ(c.arch, Arch::QWEN3);
    EXPECT_EQ(c.head_dim, 128);
    EXPECT_NE(c.head_dim, c.hidden_size / c.num_heads);  // 1024 / 16 = 64
    EXPECT_EQ(c.q_dim(), 2048);
    EXPECT_EQ(c.kv_dim(), 1024);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.num_layers, 28);
    EXPECT_EQ(c.max_position_embeddings, 40960);
    EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // written as an integer in the file
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
    // Qwen3Config's head_dim default is 128 whatever hidden / heads is.
    ModelConfig d = parse_model_config(edit(kQwen3_06B, "\"head_dim\": 128,", ""), "config.json");
    EXPECT_EQ(d.head_dim, 128);
}

TEST(HfConfig, Gpt2) {
    ModelConfig c = parse_model_config(kGpt2, "config.json");
    EXPECT_EQ(c.arch, Arch::GPT2);
    EXPECT_EQ(c.hidden_size, 768);
    EXPECT_EQ(c.num_heads, 12);
    EXPECT_EQ(c.num_kv_heads, 12);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.num_layers, 12);
    EXPECT_EQ(c.intermediate_size, 3072);  // n_inner absent → 4·n_embd
    EXPECT_EQ(c.max_position_embeddings, 1024);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_TRUE(c.qkv_bias && c.o_bias && c.mlp_bias);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{50256}));
}

TEST(HfConfig, ArchitectureFromArchitecturesWhenModelTypeMissing) {
    ModelConfig c = parse_model_config(edit(kQwen25_05B, "\"model_type\": \"qwen2\",", ""), "config.json");
    EXPECT_EQ(c.arch, Arch::QWEN2);
    EXPECT_EQ(c.model_type, "qwen2");
}

TEST(HfConfig, UnknownArchitecture) {
    std::string msg = error_of([] { parse_model_config(edit(kLlama2_7B, "\"model_type\": \"llama\"", "\"model_type\": \"falcon\""), "m/config.json"); });
    EXPECT_TRUE(contains_all(msg, {"m/config.json", "field 'model_type'", "'falcon'", "expected one of llama, mistral, qwen2, qwen3, gpt2"}));
    msg = error_of([] {
        parse_model_config(edit(edit(kLlama2_7B, "\"model_type\": \"llama\",", ""), "LlamaForCausalLM", "FalconForCausalLM"), "config.json");
    });
    EXPECT_TRUE(contains_all(msg, {"field 'architectures'", "'FalconForCausalLM'", "expected one of LlamaForCausalLM"}));
    msg = error_of([] { parse_model_config(R"({"vocab_size": 10})", "config.json"); });
    EXPECT_TRUE(contains_all(msg, {"field 'model_type' is missing"}));
    msg = error_of([] { parse_model_config(edit(kLlama2_7B, "LlamaForCausalLM", "Qwen2ForCausalLM"), "config.json"); });
    EXPECT_TRUE(contains_all(msg, {"'Qwen2ForCausalLM'", "contradicts model_type 'llama'"}));
}

TEST(HfConfig, MissingAndMistypedFields) {
    auto err = [](const std::string& text) { return error_of([&] { parse_model_config(text, "dir/config.json"); }); };
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"hidden_size\": 4096,", "")),
                             {"dir/config.json", "field 'hidden_size' is missing; it is required"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"hidden_size\": 4096", "\"hidden_size\": \"4096\"")),
                             {"dir/config.json", "field 'hidden_size' must be an integer, got string \"4096\""}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"hidden_size\": 4096", "\"hidden_size\": 4096.5")),
                             {"field 'hidden_size' must be an integer, got number 4096.5"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"small\"")),
                             {"field 'rms_norm_eps' must be a number, got string \"small\""}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0")),
                             {"field 'tie_word_embeddings' must be true or false, got number 0"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"torch_dtype\": \"float16\"", "\"torch_dtype\": \"int8\"")),
                             {"field 'torch_dtype' is 'int8'; expected one of float32, float16, bfloat16"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"eos_token_id\": 2", "\"eos_token_id\": [2, \"x\"]")),
                             {"field 'eos_token_id' must be an integer or a list of integers"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"eos_token_id\": 2", "\"eos_token_id\": 32000")),
                             {"field 'eos_token_id' is 32000; expected a token id in [0, 32000)"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"")),
                             {"field 'hidden_act' is 'gelu'; expected 'silu'"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"vocab_size\": 32000", "\"vocab_size\": 99999999999")),
                             {"field 'vocab_size' is 99999999999; expected at most 2147483647"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"num_hidden_layers\": 32", "\"num_hidden_layers\": 1000000")),
                             {"field 'num_hidden_layers' is 1000000; expected at most 65536"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"hidden_size\": 4096", "\"hidden_size\": 4097")),
                             {"field 'head_dim' is missing and hidden_size (4097) is not divisible by num_attention_heads (32)"}));
    EXPECT_TRUE(contains_all(err("[1, 2]"), {"dir/config.json", "config must be a JSON object, got array of 2"}));
    EXPECT_TRUE(contains_all(err("{\"model_type\": \"llama\""), {"dir/config.json", "config is not valid JSON"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"bos_token_id\": 1", "\"bos_token_id\": 1, \"bos_token_id\": 1")),
                             {"duplicate key 'bos_token_id'"}));
}

TEST(HfConfig, ValidateRejectsImpossibleShapes) {
    auto err = [](const std::string& text) { return error_of([&] { parse_model_config(text, "config.json"); }); };
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"num_key_value_heads\": 32", "\"num_key_value_heads\": 5")),
                             {"config.json", "num_key_value_heads (5) must divide num_attention_heads (32)"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"vocab_size\": 32000", "\"vocab_size\": 0")), {"vocab_size must be > 0"}));
    EXPECT_TRUE(contains_all(err(edit(kLlama2_7B, "\"num_hidden_layers\": 32", "\"num_hidden_layers\": -2")), {"num_hidden_layers must be > 0"}));
    EXPECT_TRUE(contains_all(err(edit(kQwen3_06B, "\"head_dim\": 128", "\"head_dim\": 127")), {"head_dim must be a positive even number"}));
}

TEST(HfConfig, RopeScalingVariantsAndErrors) {
    auto with_rope = [](const std::string& rope) { return edit(kLlama2_7B, "\"rope_scaling\": null", "\"rope_scaling\": " + rope); };
    ModelConfig lin = parse_model_config(with_rope(R"({"type": "linear", "factor": 2.0})"), "c");
    EXPECT_EQ(lin.rope_scaling.type, "linear");
    EXPECT_DOUBLE_EQ(lin.rope_scaling.factor, 2.0);
    ModelConfig yarn = parse_model_config(with_rope(R"({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})"), "c");
    EXPECT_EQ(yarn.rope_scaling.type, "yarn");
    EXPECT_EQ(yarn.rope_scaling.original_max_position_embeddings, 1024);
    EXPECT_TRUE(parse_model_config(with_rope(R"({"rope_type": "default"})"), "c").rope_scaling.type.empty());

    auto err = [&](const std::string& rope) { return error_of([&] { parse_model_config(with_rope(rope), "config.json"); }); };
    EXPECT_TRUE(contains_all(err(R"({"rope_type": "su", "factor": 2.0})"),
                             {"config.json", "field 'rope_scaling.rope_type' is 'su'; expected one of default, linear, dynamic, yarn, llama3, longrope"}));
    EXPECT_TRUE(contains_all(err(R"({"rope_type": "longrope", "factor": 2.0})"),
                             {"config.json", "field 'rope_scaling.short_factor' must be a non-empty list of numbers"}));
    EXPECT_TRUE(contains_all(err(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})"),
                             {"field 'rope_scaling.original_max_position_embeddings' is missing"}));
    EXPECT_TRUE(contains_all(err(R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"),
                             {"field 'rope_scaling.high_freq_factor' is 4; expected a number > low_freq_factor (4)"}));
    EXPECT_TRUE(contains_all(err(R"({"rope_type": "linear"})"), {"field 'rope_scaling.factor' is missing"}));
    EXPECT_TRUE(contains_all(err(R"("llama3")"), {"field 'rope_scaling' must be an object or null, got string \"llama3\""}));

    // transformers v5 spelling: rope_theta and the scaling type under rope_parameters.
    ModelConfig v5 = parse_model_config(edit(kLlama2_7B, "\"rope_scaling\": null",
                                             R"("rope_parameters": {"rope_type": "default", "rope_theta": 250000.0})"), "c");
    EXPECT_DOUBLE_EQ(v5.rope_theta, 250000.0);
    EXPECT_TRUE(v5.rope_scaling.type.empty());
}

TEST(HfConfig, GenerationConfig) {
    ModelConfig c = parse_model_config(kQwen3_06B, "config.json");
    apply_generation_config(R"({"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
                                "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})", "gen.json", c);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
    EXPECT_EQ(c.pad_token_id, 151643);
    apply_generation_config(R"({"eos_token_id": 151645, "pad_token_id": null})", "gen.json", c);  // null keeps the value
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151645}));
    EXPECT_EQ(c.pad_token_id, 151643);

    ModelConfig before = c;
    std::string msg = error_of([&] { apply_generation_config(R"({"eos_token_id": [1, 999999]})", "m/generation_config.json", c); });
    EXPECT_TRUE(contains_all(msg, {"m/generation_config.json", "field 'eos_token_id' is 999999; expected a token id in [0, 151936)"}));
    EXPECT_EQ(c.eos_token_ids, before.eos_token_ids);  // unchanged after an error
    msg = error_of([&] { apply_generation_config(R"({"eos_token_id": "2"})", "g.json", c); });
    EXPECT_TRUE(contains_all(msg, {"g.json", "field 'eos_token_id' must be an integer or a list of integers, got string \"2\""}));
    msg = error_of([&] { apply_generation_config("7", "g.json", c); });
    EXPECT_TRUE(contains_all(msg, {"g.json", "generation config must be a JSON object"}));
}

TEST(HfConfig, WriterRoundTripsEveryArchitecture) {
    for (const char* text : {kLlama32_1B, kLlama2_7B, kMistral7B, kQwen25_05B, kQwen3_06B, kGpt2}) {
        ModelConfig c = parse_model_config(text, "config.json");
        std::string written = model_config_to_json(c);
        ModelConfig back = parse_model_config(written, "written.json");
        EXPECT_EQ(model_config_to_json(back), written) << written;
        EXPECT_EQ(back.arch, c.arch);
        EXPECT_EQ(back.head_dim, c.head_dim);
        EXPECT_EQ(back.num_kv_heads, c.num_kv_heads);
        EXPECT_EQ(back.intermediate_size, c.intermediate_size);
        EXPECT_EQ(back.rms_norm_eps, c.rms_norm_eps);
        EXPECT_EQ(back.rope_theta, c.rope_theta);
        EXPECT_EQ(back.rope_scaling.type, c.rope_scaling.type);
        EXPECT_EQ(back.rope_scaling.factor, c.rope_scaling.factor);
        EXPECT_EQ(back.rope_scaling.original_max_position_embeddings, c.rope_scaling.original_max_position_embeddings);
        EXPECT_EQ(back.tie_word_embeddings, c.tie_word_embeddings);
        EXPECT_EQ(back.qkv_bias, c.qkv_bias);
        EXPECT_EQ(back.o_bias, c.o_bias);
        EXPECT_EQ(back.qk_norm, c.qk_norm);
        EXPECT_EQ(back.sliding_window, c.sliding_window);
        EXPECT_EQ(back.dtype, c.dtype);
        EXPECT_EQ(back.bos_token_id, c.bos_token_id);
        EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
    }
    // Generation config too (through files, as a folder would hold them).
    test::TempDir dir;
    ModelConfig c = test::tiny_config(Arch::QWEN3);
    c.eos_token_ids = {2, 3};
    c.pad_token_id = 4;
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 32;
    c.partial_rotary_factor = 0.5;
    write_hf_model_config(dir.path(), c);
    ModelConfig back = read_hf_model_config(dir.path());
    EXPECT_EQ(back.eos_token_ids, c.eos_token_ids);
    EXPECT_EQ(back.pad_token_id, 4);
    EXPECT_EQ(back.head_dim, 16);
    EXPECT_EQ(back.rope_scaling.type, "yarn");
    EXPECT_EQ(back.partial_rotary_factor, 0.5);
    EXPECT_EQ(back.name, dir.path().substr(dir.path().find_last_of('/') + 1));  // the folder's name
}

TEST(HfConfig, WriterRefusesConfigsTheFormatCannotCarry) {
    ModelConfig c = test::tiny_config(Arch::QWEN2);
    c.qkv_bias = false;
    EXPECT_TRUE(contains_all(error_of([&] { model_config_to_json(c); }), {"qwen2", "always has q/k/v biases"}));
    c = test::tiny_config(Arch::LLAMA);
    c.qk_norm = true;
    EXPECT_TRUE(contains_all(error_of([&] { model_config_to_json(c); }), {"q/k norm exists exactly in qwen3"}));
    c = test::tiny_config(Arch::LLAMA);
    c.num_kv_heads = 3;
    EXPECT_TRUE(contains_all(error_of([&] { model_config_to_json(c); }), {"num_key_value_heads (3) must divide"}));
}

}  // namespace
}  // namespace kv
