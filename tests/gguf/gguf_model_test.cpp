// Loading synthetic Llama/Qwen2 GGUF files written by the tests: config mapping, HF names and
// shapes, the Q/K un-permutation (HF weights -> the converter's documented permutation -> GGUF ->
// load -> original HF rows), quantized storage, tied/untied heads, bf16 and zero-copy output,
// tokenizer data, and every model-level error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <random>
#include <tuple>

#include "formats/gguf/gguf_config.h"
#include "formats/gguf/gguf_model.h"
#include "formats/gguf/gguf_names.h"
#include "formats/gguf/gguf_parse.h"
#include "formats/gguf/gguf_reader.h"
#include "formats/gguf/gguf_rope_permute.h"
#include "formats/gguf/gguf_writer.h"
#include "gguf_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using gguf_test::expect_error;
using gguf_test::TempDir;

// The converter's permutation exactly as documented (docs/gguf.md, llama.tensor_data_layout):
//   W.reshape(n_head, 2, D/2, *rest).swapaxes(1, 2).reshape(W.shape)
// Output row (h, i, j) of the (n_head, D/2, 2) view is input row (h, j, i) of the (n_head, 2, D/2)
// view. Rows are `row_bytes` wide, so this permutes float rows and rows of quantized blocks alike.
std::vector<uint8_t> converter_permute(const std::vector<uint8_t>& w, int64_t rows, size_t row_bytes, int64_t n_head) {
    const int64_t half = rows / n_head / 2;
    std::vector<uint8_t> out(w.size());
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t i = 0; i < half; ++i)
            for (int64_t j = 0; j < 2; ++j) {
                const int64_t out_row = (h * half + i) * 2 + j;  // index into (n_head, D/2, 2)
                const int64_t in_row = (h * 2 + j) * half + i;   // index into (n_head, 2, D/2)
                std::memcpy(out.data() + size_t(out_row) * row_bytes, w.data() + size_t(in_row) * row_bytes, row_bytes);
            }
    return out;
}

std::vector<uint8_t> as_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Q8_0 quantization of a row-major [rows, cols] matrix (cols % 32 == 0), and its exact dequantization.
std::vector<uint8_t> quantize_q8_0(const std::vector<float>& x, std::vector<float>& deq) {
    std::vector<uint8_t> out;
    deq.assign(x.size(), 0.0f);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + size_t(j)]));
        const uint16_t dh = f32_to_f16(amax / 127.0f);
        const float d = f16_to_f32(dh);
        out.push_back(uint8_t(dh));
        out.push_back(uint8_t(dh >> 8));
        for (int j = 0; j < 32; ++j) {
            int q = d > 0 ? int(std::lround(x[b * 32 + size_t(j)] / d)) : 0;
            q = std::max(-127, std::min(127, q));
            out.push_back(uint8_t(int8_t(q)));
            deq[b * 32 + size_t(j)] = float(q) * d;
        }
    }
    return out;
}

struct Spec {
    std::string arch = "llama";
    int64_t E = 64, NH = 4, G = 2, HD = 16, I = 96, V = 40, L = 2;
    bool tied = true;
    bool bias = false;     // q/k/v biases (qwen2)
    bool q8 = false;       // store matrices as Q8_0 instead of F32
    bool permute = true;   // apply the converter's Q/K permutation (what llama.cpp does for llama)
};

// HF tensors (the truth) and the GGUF file written from them.
struct Tiny {
    Spec s;
    std::map<std::string, std::vector<int64_t>> shapes;
    std::map<std::string, std::vector<float>> hf;  // what loading must return (dequantized if q8)
    GgufWriter w;
};

void put_metadata(GgufWriter& w, const Spec& s, bool tokenizer = true) {
    const std::string a = s.arch;
    w.set("general.architecture", GgufValue::of_string(a));
    w.set("general.name", GgufValue::of_string("tiny"));
    w.set(a + ".block_count", GgufValue::of_u32(uint32_t(s.L)));
    w.set(a + ".context_length", GgufValue::of_u64(2048));  // u64 on purpose: readers accept both
    w.set(a + ".embedding_length", GgufValue::of_u32(uint32_t(s.E)));
    w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(s.I)));
    w.set(a + ".attention.head_count", GgufValue::of_u32(uint32_t(s.NH)));
    w.set(a + ".attention.head_count_kv", GgufValue::of_u32(uint32_t(s.G)));
    w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e-5f));
    w.set(a + ".rope.freq_base", GgufValue::of_f32(100000.0f));
    w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(s.HD)));
    if (!tokenizer) return;
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int64_t i = 0; i < s.V; ++i) {
        tokens.push_back(i < 3 ? std::string("<|s") + char('0' + i) + "|>" : std::string(1, char('a' + i % 26)) + std::to_string(i));
        types.push_back(i < 3 ? 3 : 1);
    }
    w.set("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
    w.set("tokenizer.ggml.pre", GgufValue::of_string("smollm"));
    w.set("tokenizer.ggml.tokens", GgufValue::of_string_array(tokens));
    w.set("tokenizer.ggml.token_type", GgufValue::of_i32_array(types));
    w.set("tokenizer.ggml.merges", GgufValue::of_string_array({"a b", "ab c"}));
    w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(1));
    w.set("tokenizer.ggml.eos_token_id", GgufValue::of_u32(2));
    w.set("tokenizer.ggml.padding_token_id", GgufValue::of_u32(2));
    w.set("tokenizer.ggml.add_bos_token", GgufValue::of_bool(false));
    w.set("tokenizer.chat_template", GgufValue::of_string("{{ messages }}"));
}

Tiny make_tiny(const Spec& s, uint64_t seed) {
    Tiny t;
    t.s = s;
    const int64_t Q = s.NH * s.HD, KV = s.G * s.HD;
    auto& sh = t.shapes;
    sh["model.embed_tokens.weight"] = {s.V, s.E};
    sh["model.norm.weight"] = {s.E};
    if (!s.tied) sh["lm_head.weight"] = {s.V, s.E};
    for (int64_t l = 0; l < s.L; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        sh[p + "input_layernorm.weight"] = {s.E};
        sh[p + "post_attention_layernorm.weight"] = {s.E};
        sh[p + "self_attn.q_proj.weight"] = {Q, s.E};
        sh[p + "self_attn.k_proj.weight"] = {KV, s.E};
        sh[p + "self_attn.v_proj.weight"] = {KV, s.E};
        sh[p + "self_attn.o_proj.weight"] = {s.E, Q};
        sh[p + "mlp.gate_proj.weight"] = {s.I, s.E};
        sh[p + "mlp.up_proj.weight"] = {s.I, s.E};
        sh[p + "mlp.down_proj.weight"] = {s.E, s.I};
        if (s.bias) {
            sh[p + "self_attn.q_proj.bias"] = {Q};
            sh[p + "self_attn.k_proj.bias"] = {KV};
            sh[p + "self_attn.v_proj.bias"] = {KV};
        }
    }
    put_metadata(t.w, s);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (const auto& [name, shape] : sh) {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = u(rng);
        const bool is_q = name.find("q_proj") != std::string::npos, is_k = name.find("k_proj") != std::string::npos;
        const int64_t heads = is_q ? s.NH : s.G;
        const bool permute = s.permute && (is_q || is_k);
        const int64_t rows = shape[0];
        std::vector<int64_t> ne(shape.rbegin(), shape.rend());
        const std::string gname = hf_to_gguf_name(name);
        if (s.q8 && shape.size() == 2) {
            std::vector<float> deq;
            std::vector<uint8_t> q = quantize_q8_0(v, deq);
            if (permute) q = converter_permute(q, rows, q.size() / size_t(rows), heads);
            t.w.add_tensor(gname, GgmlType::Q8_0, ne, q);
            t.hf[name] = deq;
        } else {
            std::vector<uint8_t> b = as_bytes(v);
            // A 1-D bias is permuted as rows of one element, exactly like the converter does.
            if (permute) b = converter_permute(b, rows, b.size() / size_t(rows), heads);
            t.w.add_tensor(gname, GgmlType::F32, ne, b);
            t.hf[name] = v;
        }
    }
    return t;
}

std::vector<float> values(const Tensor& t) { return t.to_f32_vector(); }

TEST(GgufNames, LlamaCppToHuggingFace) {
    const std::vector<std::pair<std::string, std::string>> table = {
        {"token_embd.weight", "model.embed_tokens.weight"},
        {"output_norm.weight", "model.norm.weight"},
        {"output.weight", "lm_head.weight"},
        {"blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"},
        {"blk.12.attn_k.weight", "model.layers.12.self_attn.k_proj.weight"},
        {"blk.3.attn_v.bias", "model.layers.3.self_attn.v_proj.bias"},
        {"blk.29.attn_output.weight", "model.layers.29.self_attn.o_proj.weight"},
        {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"},
        {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
        {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},
        {"blk.7.attn_norm.weight", "model.layers.7.input_layernorm.weight"},
        {"blk.7.ffn_norm.weight", "model.layers.7.post_attention_layernorm.weight"},
    };
    for (const auto& [g, h] : table) {
        GgufHfName n = gguf_to_hf_name(g);
        EXPECT_EQ(n.hf, h) << g;
        EXPECT_EQ(hf_to_gguf_name(h), g) << h;
    }
    EXPECT_EQ(gguf_to_hf_name("blk.12.attn_k.weight").layer, 12);
    for (const char* bad : {"blk.01.attn_q.weight", "blk.x.attn_q.weight", "blk.3.attn_qq.weight", "blk.3.attn_q",
                            "blk..attn_q.weight", "blk.1234567.attn_q.weight", "rope_freqs.weight", "token_embd.scale",
                            "blk.-1.attn_q.weight", ""})
        EXPECT_EQ(gguf_to_hf_name(bad).hf, "") << bad;
}

// llama.cpp's names for the families whose norms or projections differ (gguf-py's
// constants.py and tensor_mapping.py): Gemma's four norms (post_attention_norm, post_ffw_norm),
// OLMo 2's output norms, Phi-3's fused projections, gpt-oss's sinks, router and experts,
// DeepSeek-V2's latent attention, LFM2's short convolution and final norm (token_embd_norm).
TEST(GgufNames, FamilyLayouts) {
    const GgufLayout gemma{NormPlacement::BOTH, false}, olmo{NormPlacement::POST, false}, phi{NormPlacement::PRE, true};
    const GgufLayout oss{NormPlacement::PRE, false, true}, lfm2{NormPlacement::PRE, false, false, true};
    const std::vector<std::tuple<GgufLayout, std::string, std::string>> table = {
        {gemma, "blk.2.attn_norm.weight", "model.layers.2.input_layernorm.weight"},
        {gemma, "blk.2.post_attention_norm.weight", "model.layers.2.post_attention_layernorm.weight"},
        {gemma, "blk.2.ffn_norm.weight", "model.layers.2.pre_feedforward_layernorm.weight"},
        {gemma, "blk.2.post_ffw_norm.weight", "model.layers.2.post_feedforward_layernorm.weight"},
        {gemma, "blk.2.attn_q_norm.weight", "model.layers.2.self_attn.q_norm.weight"},
        {gemma, "blk.2.attn_k_norm.weight", "model.layers.2.self_attn.k_norm.weight"},
        {olmo, "blk.0.post_attention_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
        {olmo, "blk.0.post_ffw_norm.weight", "model.layers.0.post_feedforward_layernorm.weight"},
        {phi, "blk.1.attn_qkv.weight", "model.layers.1.self_attn.qkv_proj.weight"},
        {phi, "blk.1.ffn_up.weight", "model.layers.1.mlp.gate_up_proj.weight"},
        {phi, "blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {oss, "blk.0.post_attention_norm.weight", "model.layers.0.post_attention_layernorm.weight"},
        {oss, "blk.0.attn_sinks.weight", "model.layers.0.self_attn.sinks"},
        {oss, "blk.0.ffn_gate_inp.weight", "model.layers.0.mlp.router.weight"},
        {oss, "blk.0.ffn_gate_inp.bias", "model.layers.0.mlp.router.bias"},
        {oss, "blk.3.ffn_gate_exps.weight", "model.layers.3.mlp.experts.gate_proj.weight"},
        {oss, "blk.3.ffn_up_exps.bias", "model.layers.3.mlp.experts.up_proj.bias"},
        {oss, "blk.3.ffn_gate_up_exps.weight", "model.layers.3.mlp.experts.gate_up_proj.weight"},
        {oss, "blk.3.ffn_down_exps.weight", "model.layers.3.mlp.experts.down_proj.weight"},
        {GgufLayout{}, "blk.1.attn_q_a.weight", "model.layers.1.self_attn.q_a_proj.weight"},
        {GgufLayout{}, "blk.1.attn_q_a_norm.weight", "model.layers.1.self_attn.q_a_layernorm.weight"},
        {GgufLayout{}, "blk.1.attn_q_b.weight", "model.layers.1.self_attn.q_b_proj.weight"},
        {GgufLayout{}, "blk.1.attn_kv_a_mqa.weight", "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"},
        {GgufLayout{}, "blk.1.attn_kv_a_norm.weight", "model.layers.1.self_attn.kv_a_layernorm.weight"},
        {GgufLayout{}, "blk.1.attn_kv_b.weight", "model.layers.1.self_attn.kv_b_proj.weight"},
        {GgufLayout{}, "blk.1.attn_k_b.weight", "model.layers.1.self_attn.k_b_proj.weight"},
        {GgufLayout{}, "blk.1.attn_v_b.weight", "model.layers.1.self_attn.v_b_proj.weight"},
        {lfm2, "token_embd_norm.weight", "model.norm.weight"},
        {lfm2, "blk.0.shortconv.conv.weight", "model.layers.0.conv.conv.weight"},
        {lfm2, "blk.0.shortconv.in_proj.weight", "model.layers.0.conv.in_proj.weight"},
        {lfm2, "blk.0.shortconv.out_proj.weight", "model.layers.0.conv.out_proj.weight"},
    };
    for (const auto& [layout, g, h] : table) {
        EXPECT_EQ(gguf_to_hf_name(g, layout).hf, h) << g;
        EXPECT_EQ(hf_to_gguf_name(h, layout), g) << h;
    }
    // Names of another layout are not part of this one.
    EXPECT_EQ(gguf_to_hf_name("blk.0.attn_norm.weight", olmo).hf, "");
    EXPECT_EQ(gguf_to_hf_name("blk.0.post_ffw_norm.weight", GgufLayout{}).hf, "");
    EXPECT_EQ(gguf_to_hf_name("blk.0.attn_qkv.weight", GgufLayout{}).hf, "");
    EXPECT_EQ(gguf_to_hf_name("blk.0.ffn_norm.weight", oss).hf, "");
    EXPECT_EQ(gguf_to_hf_name("blk.0.attn_sinks.bias", oss).hf, "");  // sinks have no bias
    EXPECT_EQ(gguf_to_hf_name("token_embd_norm.weight", GgufLayout{}).hf, "");
    EXPECT_EQ(gguf_to_hf_name("output_norm.weight", lfm2).hf, "model.norm.weight");  // both names of LFM2's final norm
}

TEST(GgufRopePermute, FormulaAndErrors) {
    // D = 4, 1 head: GGUF rows (0,1,2,3) hold HF rows (0,2,1,3).
    EXPECT_EQ(gguf_unpermute_rows(4, 1, "t"), (std::vector<int64_t>{0, 2, 1, 3}));
    // D = 6, 2 heads: per head [0, 3, 1, 4, 2, 5].
    EXPECT_EQ(gguf_unpermute_rows(12, 2, "t"), (std::vector<int64_t>{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
    expect_error([] { gguf_unpermute_rows(10, 3, "x.gguf: tensor 'q'"); },
                 {"x.gguf: tensor 'q': 10 rows cannot be split into 3 heads of an even head size"});
}

TEST(GgufModel, LlamaF32LoadsHfLayoutAndUndoesQkPermutation) {
    TempDir dir;
    Tiny t = make_tiny(Spec{}, test::seed_for("GgufModel.LlamaF32"));
    const std::string path = dir.file("tiny.gguf");
    t.w.write(path);
    GgufModel m = load_gguf_model(path);
    const ModelConfig& c = m.config;
    EXPECT_EQ(c.arch, Arch::LLAMA);
    EXPECT_EQ(c.model_type, "llama");
    EXPECT_EQ(c.name, "tiny");
    EXPECT_EQ(c.num_layers, 2);
    EXPECT_EQ(c.hidden_size, 64);
    EXPECT_EQ(c.intermediate_size, 96);
    EXPECT_EQ(c.num_heads, 4);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.vocab_size, 40);
    EXPECT_EQ(c.max_position_embeddings, 2048);
    EXPECT_EQ(c.rms_norm_eps, double(1e-5f));
    EXPECT_EQ(c.rope_theta, 100000.0);
    EXPECT_EQ(c.partial_rotary_factor, 1.0);
    EXPECT_TRUE(c.tie_word_embeddings);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.bos_token_id, 1);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
    EXPECT_EQ(c.pad_token_id, 2);
    EXPECT_TRUE(m.qk_unpermuted);
    ASSERT_EQ(m.tensors.size(), t.hf.size());
    EXPECT_EQ(m.tensors.count("lm_head.weight"), 0u);
    for (const auto& [name, want] : t.hf) {
        ASSERT_TRUE(m.tensors.count(name)) << name;
        const Tensor& got = m.tensors.at(name);
        EXPECT_EQ(got.shape().vec(), t.shapes.at(name)) << name;
        EXPECT_EQ(got.dtype(), DType::F32);
        EXPECT_EQ(got.category(), MemCategory::WEIGHTS);
        EXPECT_EQ(values(got), want) << name;  // q/k: the original HF rows, bit for bit
    }
    // The permutation is not the identity: the raw GGUF rows of q differ from the HF rows.
    GgufReader r(path);
    EXPECT_NE(values(r.load("blk.0.attn_q.weight")), t.hf.at("model.layers.0.self_attn.q_proj.weight"));
    EXPECT_NE(values(r.load("blk.1.attn_k.weight")), t.hf.at("model.layers.1.self_attn.k_proj.weight"));
    // Tokenizer data.
    const GgufTokenizerData& tok = m.tokenizer;
    EXPECT_EQ(tok.model, "gpt2");
    EXPECT_EQ(tok.pre, "smollm");
    ASSERT_EQ(tok.tokens.size(), 40u);
    EXPECT_EQ(tok.tokens[1], "<|s1|>");
    EXPECT_EQ(tok.token_types[0], 3);
    EXPECT_EQ(tok.token_types[5], 1);
    EXPECT_TRUE(tok.scores.empty());
    EXPECT_EQ(tok.merges, (std::vector<std::string>{"a b", "ab c"}));
    EXPECT_EQ(tok.bos_id, 1);
    EXPECT_EQ(tok.eos_id, 2);
    EXPECT_EQ(tok.pad_id, 2);
    EXPECT_EQ(tok.unk_id, -1);
    EXPECT_EQ(tok.add_bos_token, std::optional<bool>(false));
    EXPECT_FALSE(tok.add_eos_token.has_value());
    EXPECT_EQ(tok.chat_template, "{{ messages }}");
}

TEST(GgufModel, QuantizedQkRowsAreUnpermutedToo) {
    TempDir dir;
    Spec s;
    s.q8 = true;
    s.tied = false;
    Tiny t = make_tiny(s, test::seed_for("GgufModel.Q8"));
    t.w.write(dir.file("q8.gguf"));
    GgufModel m = load_gguf_model(dir.file("q8.gguf"));
    EXPECT_FALSE(m.config.tie_word_embeddings);
    ASSERT_EQ(m.tensors.size(), t.hf.size());
    for (const auto& [name, want] : t.hf) EXPECT_EQ(values(m.tensors.at(name)), want) << name;
}

TEST(GgufModel, Qwen2KeepsRowOrderAndLoadsBiases) {
    TempDir dir;
    Spec s;
    s.arch = "qwen2";
    s.bias = true;
    s.permute = false;  // llama.cpp runs qwen2 with NeoX RoPE and does not permute it
    Tiny t = make_tiny(s, test::seed_for("GgufModel.Qwen2"));
    t.w.write(dir.file("qwen.gguf"));
    GgufModel m = load_gguf_model(dir.file("qwen.gguf"));
    EXPECT_EQ(m.config.arch, Arch::QWEN2);
    EXPECT_TRUE(m.config.qkv_bias);
    EXPECT_FALSE(m.qk_unpermuted);
    for (const auto& [name, want] : t.hf) EXPECT_EQ(values(m.tensors.at(name)), want) << name;
}

TEST(GgufModel, LlamaBiasesAreUnpermutedLikeTheirWeights) {
    TempDir dir;
    Spec s;
    s.bias = true;  // Llama with attention_bias: the converter permutes q/k biases too
    Tiny t = make_tiny(s, test::seed_for("GgufModel.LlamaBias"));
    t.w.write(dir.file("b.gguf"));
    GgufModel m = load_gguf_model(dir.file("b.gguf"));
    for (const auto& [name, want] : t.hf) EXPECT_EQ(values(m.tensors.at(name)), want) << name;
}

TEST(GgufModel, Bf16OutputAndZeroCopy) {
    TempDir dir;
    Tiny t = make_tiny(Spec{}, test::seed_for("GgufModel.Bf16"));
    const std::string path = dir.file("t.gguf");
    t.w.write(path);
    GgufLoadOptions o;
    o.dtype = DType::BF16;
    GgufModel m = load_gguf_model(path, o);
    EXPECT_EQ(m.config.dtype, DType::BF16);
    for (const auto& [name, want] : t.hf) {
        const Tensor& got = m.tensors.at(name);
        ASSERT_EQ(got.dtype(), DType::BF16);
        const uint16_t* p = got.data<uint16_t>();
        for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(p[i], f32_to_bf16(want[i])) << name << " " << i;
    }
    // F32 -> F32 tensors that need no reordering are views of the mapping; writing them is
    // private (copy-on-write) and never reaches the file.
    GgufModel z = load_gguf_model(path);
    Tensor norm = z.tensors.at("model.norm.weight");
    EXPECT_FALSE(norm.storage()->owned);
    EXPECT_TRUE(z.tensors.at("model.layers.0.self_attn.q_proj.weight").storage()->owned);  // reordered: a copy
    norm.fill(123.0);
    EXPECT_EQ(values(load_gguf_model(path).tensors.at("model.norm.weight")), t.hf.at("model.norm.weight"));
    GgufLoadOptions copy;
    copy.zero_copy = false;
    EXPECT_TRUE(load_gguf_model(path, copy).tensors.at("model.norm.weight").storage()->owned);
}

// ---- model-level errors --------------------------------------------------------------------
std::string write_variant(TempDir& dir, const std::string& name, const std::function<void(Tiny&)>& edit,
                          Spec s = Spec{}) {
    Tiny t = make_tiny(s, 7);
    edit(t);
    const std::string path = dir.file(name);
    t.w.write(path);
    return path;
}

TEST(GgufModelErrors, EveryProblemIsNamed) {
    TempDir dir;
    auto fails = [&](const std::string& name, const std::function<void(Tiny&)>& edit, std::vector<std::string> parts) {
        const std::string path = write_variant(dir, name, edit);
        parts.insert(parts.begin(), path + ": ");
        expect_error([&] { load_gguf_model(path); }, parts);
    };
    fails("arch.gguf", [](Tiny& t) { t.w.set("general.architecture", GgufValue::of_string("mamba")); },
          {"architecture 'mamba' is not supported from GGUF, expected one of llama, qwen2, gemma2, gemma3, phi3, olmo2"});
    fails("nokey.gguf", [](Tiny& t) { t.w.set("llama.block_count", GgufValue::of_string("2")); },
          {"metadata key 'llama.block_count': is string '2', expected an integer"});
    fails("zero.gguf", [](Tiny& t) { t.w.set("llama.attention.head_count", GgufValue::of_u32(0)); },
          {"metadata key 'llama.attention.head_count' is 0, expected a value in [1, 2^31)"});
    fails("heads.gguf", [](Tiny& t) { t.w.set("llama.attention.head_count", GgufValue::of_u32(5)); },
          {"llama.embedding_length' = 64 is not divisible by head_count 5"});
    fails("rope.gguf", [](Tiny& t) { t.w.set("llama.rope.dimension_count", GgufValue::of_u32(20)); },
          {"llama.rope.dimension_count' = 20, expected an even number <= head size 16"});
    fails("eps.gguf", [](Tiny& t) { t.w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_f32(NAN)); },
          {"llama.attention.layer_norm_rms_epsilon' is nan, expected a finite non-negative number"});
    fails("extra.gguf", [](Tiny& t) { t.w.add_float_tensor("blk.0.attn_qkv.weight", {4}, {1, 2, 3, 4}); },
          {"tensor 'blk.0.attn_qkv.weight' is not part of the llama layout"});
    fails("layer.gguf", [](Tiny& t) { t.w.add_float_tensor("blk.2.attn_norm.weight", {64}, std::vector<float>(64)); },
          {"tensor 'blk.2.attn_norm.weight' belongs to layer 2 but llama.block_count is 2"});
    // Biases are on when layer 0 has them: one in layer 1 alone is unexpected, one in layer 0
    // alone leaves the others missing.
    fails("obias.gguf", [](Tiny& t) { t.w.add_float_tensor("blk.1.attn_output.bias", {64}, std::vector<float>(64)); },
          {"tensor 'blk.1.attn_output.bias' (model.layers.1.self_attn.o_proj.bias) is not expected"});
    fails("obias0.gguf", [](Tiny& t) { t.w.add_float_tensor("blk.0.attn_output.bias", {64}, std::vector<float>(64)); },
          {"1 tensor(s) of the llama layout are missing: blk.1.attn_output.bias (model.layers.1.self_attn.o_proj.bias)"});
    fails("shape.gguf", [](Tiny& t) { t.w.set("llama.feed_forward_length", GgufValue::of_u32(128)); },
          {"tensor 'blk.0.ffn_down.weight' (model.layers.0.mlp.down_proj.weight) has shape [64, 96] (ggml ne=[96, 64]), "
           "expected [64, 128] from the metadata"});
    fails("missing.gguf", [](Tiny& t) { t.w.set("llama.block_count", GgufValue::of_u32(3)); },
          {"9 tensor(s) of the llama layout are missing: blk.2.attn_norm.weight (model.layers.2.input_layernorm.weight)"});
    fails("type.gguf",
          [](Tiny& t) { t.w.add_tensor("output.weight", GgmlType::Q8_1, {64, 40}, std::vector<uint8_t>(36 * 2 * 40)); },
          {"tensor 'output.weight' has ggml type Q8_1, which kvlab cannot dequantize; supported: F32, F16, BF16, Q8_0"});
    fails("vocab.gguf",
          [](Tiny& t) {
              t.w.set("tokenizer.ggml.tokens", GgufValue::of_string_array(std::vector<std::string>(41, "x")));
              t.w.set("tokenizer.ggml.token_type", GgufValue::of_i32_array(std::vector<int32_t>(41, 1)));
          },
          {"token_embd.weight has 40 rows but the vocabulary has 41 tokens"});
    fails("scores.gguf", [](Tiny& t) { t.w.set("tokenizer.ggml.scores", GgufValue::of_f32_array({0.5f})); },
          {"metadata key 'tokenizer.ggml.scores' has 1 entries, expected one per token (40)"});
    fails("bos.gguf", [](Tiny& t) { t.w.set("tokenizer.ggml.bos_token_id", GgufValue::of_u32(40)); },
          {"metadata key 'tokenizer.ggml.bos_token_id' is 40, expected a token id in [0, 40)"});
    fails("ttype.gguf", [](Tiny& t) { t.w.set("tokenizer.ggml.token_type", GgufValue::of_i32_array(std::vector<int32_t>(40, 9))); },
          {"tokenizer.ggml.token_type' entry 0 is 9, expected a token type in 0..6"});
    expect_error([&] { load_gguf_model(dir.file("absent.gguf")); }, {dir.file("absent.gguf") + ": cannot open GGUF file"});
}

// Corrupted copies of a valid file (issue 17): each of these used to load and give a plausible
// loss. A relabelled tensor type leaves a gap in the data section; a non-finite block scale or
// weight, a huge weight and an absurd epsilon are refused with the tensor or key named.
std::vector<uint8_t> file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// Byte position of tensor `name`'s ggml type field in the header (independent of the parser:
// found as the length-prefixed name followed by n_dims and the dims).
size_t type_field(const std::vector<uint8_t>& b, const std::string& name) {
    std::vector<uint8_t> needle(8 + name.size());
    const uint64_t len = name.size();
    std::memcpy(needle.data(), &len, 8);
    std::memcpy(needle.data() + 8, name.data(), name.size());
    auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
    if (it == b.end()) throw std::runtime_error("tensor name not found: " + name);
    size_t p = size_t(it - b.begin()) + needle.size();
    uint32_t nd = 0;
    std::memcpy(&nd, b.data() + p, 4);
    return p + 4 + 8 * size_t(nd);
}

TEST(GgufModelErrors, CorruptedCopiesAreRefused) {
    TempDir dir;
    Spec q8;
    q8.q8 = true;
    const std::string good = write_variant(dir, "good.gguf", [](Tiny&) {}, q8);
    ASSERT_NO_THROW(load_gguf_model(good));
    const std::vector<uint8_t> base = file_bytes(good);
    const GgufFile f = gguf_parse(base.data(), base.size(), good);
    auto variant = [&](const std::string& name, const std::function<void(std::vector<uint8_t>&)>& edit) {
        std::vector<uint8_t> b = base;
        edit(b);
        const std::string path = dir.file(name);
        write_bytes(path, b);
        return path;
    };
    auto set_type = [&](const std::string& tensor, GgmlType t) {
        return [=](std::vector<uint8_t>& b) {
            const uint32_t id = uint32_t(t);
            std::memcpy(b.data() + type_field(b, tensor), &id, 4);
        };
    };
    auto data_of = [&](const std::string& tensor) { return size_t(f.find_tensor(tensor)->file_offset); };

    // Q8_0 relabelled Q4_0 (as Q4_1 -> Q4_0 in the field report): a gap after the tensor.
    std::string p = variant("q8_as_q4.gguf", set_type("blk.0.ffn_up.weight", GgmlType::Q4_0));
    expect_error([&] { load_gguf_model(p); }, {p + ": tensor '", "a gap of", "tile the data section"});
    // A norm weight relabelled F16 (half its bytes): a gap too.
    p = variant("norm_f16.gguf", set_type("blk.0.attn_norm.weight", GgmlType::F16));
    expect_error([&] { load_gguf_model(p); }, {p + ": tensor '", "a gap of", "tile the data section"});
    // NaN and Inf as the first block scale (f16) of a Q8_0 matrix.
    for (uint16_t bits : {uint16_t(0x7e00), uint16_t(0x7c00)}) {
        p = variant(bits == 0x7e00 ? "nan_scale.gguf" : "inf_scale.gguf", [&](std::vector<uint8_t>& b) {
            std::memcpy(b.data() + data_of("blk.1.ffn_down.weight"), &bits, 2);
        });
        expect_error([&] { load_gguf_model(p); },
                     {p + ": tensor 'model.layers.1.mlp.down_proj.weight' element ", "expected finite weights"});
    }
    // NaN in an f32 norm weight, and a finite but absurd value (a flipped exponent bit).
    p = variant("nan_norm.gguf", [&](std::vector<uint8_t>& b) {
        const float v = NAN;
        std::memcpy(b.data() + data_of("blk.0.attn_norm.weight") + 3 * 4, &v, 4);
    });
    expect_error([&] { load_gguf_model(p); }, {p + ": tensor 'model.layers.0.input_layernorm.weight' element 3 (of 64) is nan"});
    p = variant("huge_norm.gguf", [&](std::vector<uint8_t>& b) {
        const float v = 3e7f;
        std::memcpy(b.data() + data_of("output_norm.weight") + 5 * 4, &v, 4);
    });
    expect_error([&] { load_gguf_model(p); },
                 {p + ": tensor 'model.norm.weight' element 5 (of 64) is 3e+07, beyond the plausible weight magnitude"});
    // rms_norm_eps 1e30 and a rope base of 0.5.
    p = write_variant(dir, "eps30.gguf",
                      [](Tiny& t) { t.w.set("llama.attention.layer_norm_rms_epsilon", GgufValue::of_f32(1e30f)); }, q8);
    expect_error([&] { load_gguf_model(p); }, {p + ": rms_norm_eps 1e+30 is implausible"});
    p = write_variant(dir, "rope.gguf", [](Tiny& t) { t.w.set("llama.rope.freq_base", GgufValue::of_f32(0.5f)); }, q8);
    expect_error([&] { load_gguf_model(p); }, {p + ": rope_theta 0.5 is implausible"});
}

TEST(GgufConfig, OptionalKeysAndScaling) {
    GgufWriter w;
    Spec s;
    put_metadata(w, s);
    w.set("llama.attention.key_length", GgufValue::of_u32(32));  // explicit head size (> hidden / heads)
    w.set("llama.rope.dimension_count", GgufValue::of_u32(16));   // partial rotary
    w.set("llama.rope.scaling.type", GgufValue::of_string("yarn"));
    w.set("llama.rope.scaling.factor", GgufValue::of_f32(4.0f));
    w.set("llama.rope.scaling.original_context_length", GgufValue::of_u32(512));
    std::vector<uint8_t> b = w.bytes();
    GgufFile f = gguf_parse(b.data(), b.size(), "c.gguf");
    ModelConfig c = gguf_model_config(f);
    EXPECT_EQ(c.head_dim, 32);
    EXPECT_EQ(c.partial_rotary_factor, 0.5);
    EXPECT_EQ(c.rope_dims(), 16);
    EXPECT_EQ(c.rope_scaling.type, "yarn");
    EXPECT_EQ(c.rope_scaling.factor, 4.0);
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 512);
    EXPECT_EQ(c.vocab_size, 40);  // the token list
    // No tokenizer: vocab size from {arch}.vocab_size; neither: a clear error.
    GgufWriter v;
    put_metadata(v, s, false);
    b = v.bytes();
    f = gguf_parse(b.data(), b.size(), "v.gguf");
    expect_error([&] { gguf_model_config(f); },
                 {"v.gguf: no vocabulary size: neither tokenizer.ggml.tokens nor llama.vocab_size is present"});
    v.set("llama.vocab_size", GgufValue::of_u32(77));
    b = v.bytes();
    f = gguf_parse(b.data(), b.size(), "v.gguf");
    c = gguf_model_config(f);
    EXPECT_EQ(c.vocab_size, 77);
    EXPECT_EQ(c.bos_token_id, -1);
    EXPECT_TRUE(gguf_tokenizer_data(f).empty());
    // Old linear-scaling key.
    v.set("llama.rope.scale_linear", GgufValue::of_f32(2.0f));
    b = v.bytes();
    f = gguf_parse(b.data(), b.size(), "v.gguf");
    EXPECT_EQ(gguf_model_config(f).rope_scaling.type, "linear");
    EXPECT_EQ(gguf_model_config(f).rope_scaling.factor, 2.0);
    // No {arch}.attention.sliding_window: full attention; with one, every layer is windowed.
    EXPECT_EQ(gguf_model_config(f).sliding_window, 0);
    v.set("llama.attention.sliding_window", GgufValue::of_u32(4096));
    b = v.bytes();
    f = gguf_parse(b.data(), b.size(), "v.gguf");
    c = gguf_model_config(f);
    EXPECT_EQ(c.sliding_window, 4096);
    EXPECT_EQ(c.layer_window(0), 4096);
    EXPECT_EQ(c.layer_window(c.num_layers - 1), 4096);
}

}  // namespace
}  // namespace kv
