// GGUF files of Gemma 2, Gemma 3, Phi-3, OLMo 2, SmolLM3 and gpt-oss with llama.cpp's metadata
// and tensor names, converted here from the PyTorch fixtures (tests/fixtures/models) as
// llama.cpp's convert_hf_to_gguf.py does: its names per architecture (written out below, not
// taken from kvlab's table), Gemma's norm weights stored as 1 + w, SmolLM3's Q/K rows permuted
// as LlamaModel.permute does (the others use NeoX RoPE: no permutation), gpt-oss's experts
// transposed to [out, in] with the interleaved gate/up columns split (or stacked gate, then up,
// as ffn_gate_up_exps). Loaded by kvlab's GGUF loader, each must give the fixture's float64
// PyTorch logits within 1e-5 of max |logit| and the HF folder's layer layout.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "engine/model/transformer.h"
#include "formats/gguf/gguf_model.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

struct Family {
    const char* fixture;
    const char* arch;      // llama.cpp's general.architecture
    bool variant = false;  // llama.cpp's other form: gpt-oss's ffn_gate_up_exps (instead of ffn_gate_exps +
                           // ffn_up_exps); deepseek2's older converters (attn_kv_b, key_length = the head)
};

std::string family_name(const Family& f) {
    if (!f.variant) return f.fixture;
    return std::string(f.fixture) + (std::string(f.arch) == "gpt-oss" ? "_fused_experts" : "_old_converter");
}
void PrintTo(const Family& f, std::ostream* os) {
    *os << family_name(f);
}

// llama.cpp's tensor name of an HF tensor of this family (convert_hf_to_gguf.py / gguf-py's
// tensor_mapping.py), "" for none.
std::string llama_cpp_name(const std::string& arch, const std::string& hf) {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    if (hf == "model.embedding_norm.weight") return "token_embd_norm.weight";  // LFM2's final norm
    const std::string pre = "model.layers.";
    if (hf.rfind(pre, 0) != 0) return "";
    const size_t dot = hf.find('.', pre.size());
    const std::string layer = hf.substr(pre.size(), dot - pre.size()), part = hf.substr(dot + 1);
    const bool gemma = arch == "gemma2" || arch == "gemma3";
    const std::map<std::string, std::string> common = {
        {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.gate_up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"input_layernorm.weight", "attn_norm.weight"},
        {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.bias", "attn_q.bias"},
        {"self_attn.k_proj.bias", "attn_k.bias"},
        {"self_attn.v_proj.bias", "attn_v.bias"},
        {"self_attn.o_proj.bias", "attn_output.bias"},
        {"self_attn.sinks", "attn_sinks.weight"},
        {"mlp.router.weight", "ffn_gate_inp.weight"},
        {"mlp.router.bias", "ffn_gate_inp.bias"},
        {"self_attn.q_a_proj.weight", "attn_q_a.weight"},
        {"self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"},
        {"self_attn.q_b_proj.weight", "attn_q_b.weight"},
        {"self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"},
        {"self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"},
        {"self_attn.kv_b_proj.weight", "attn_kv_b.weight"},
    };
    if (arch == "lfm2") {  // LFM2's own names (the checkpoint's, before kvlab renames them)
        const std::map<std::string, std::string> lfm2 = {
            {"operator_norm.weight", "attn_norm.weight"},           {"ffn_norm.weight", "ffn_norm.weight"},
            {"feed_forward.w1.weight", "ffn_gate.weight"},          {"feed_forward.w3.weight", "ffn_up.weight"},
            {"feed_forward.w2.weight", "ffn_down.weight"},          {"self_attn.out_proj.weight", "attn_output.weight"},
            {"self_attn.q_layernorm.weight", "attn_q_norm.weight"}, {"self_attn.k_layernorm.weight", "attn_k_norm.weight"},
            {"conv.conv.weight", "shortconv.conv.weight"},          {"conv.in_proj.weight", "shortconv.in_proj.weight"},
            {"conv.out_proj.weight", "shortconv.out_proj.weight"},
        };
        if (lfm2.count(part)) return "blk." + layer + "." + lfm2.at(part);
    }
    std::string g;
    if (part == "post_attention_layernorm.weight")
        g = gemma || arch == "olmo2" || arch == "gpt-oss" ? "post_attention_norm.weight" : "ffn_norm.weight";
    else if (common.count(part)) g = common.at(part);
    return g.empty() ? "" : "blk." + layer + "." + g;
}

std::string fixture_dir(const Family& f) {
    return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + f.fixture;
}

// convert_hf_to_gguf.py's LlamaModel.permute: the rows of each head, viewed as (2, D/2), are
// transposed to (D/2, 2): GGUF row h*D + 2i + j holds HF row h*D + j*D/2 + i.
std::vector<float> llama_permute(const std::vector<float>& v, const std::vector<int64_t>& shape, int64_t heads) {
    const int64_t rows = shape[0], cols = shape[1], D = rows / heads;
    std::vector<float> out(v.size());
    for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < D / 2; ++i)
            for (int64_t j = 0; j < 2; ++j)
                for (int64_t col = 0; col < cols; ++col)
                    out[size_t((h * D + 2 * i + j) * cols + col)] = v[size_t((h * D + j * D / 2 + i) * cols + col)];
    return out;
}

// GptOssModel.modify_tensors for float experts: gate_up_proj [N, E, 2I] transposed to [N, 2I, E],
// even rows the gate and odd rows the up projection (ffn_gate_exps / ffn_up_exps, or the two
// stacked as ffn_gate_up_exps); gate_up_proj_bias split alike; down_proj [N, I, E] transposed
// to ffn_down_exps [N, E, I]; down_proj_bias as it is.
// Writes one tensor of llama.cpp's experts (as F32 unless a test stores it otherwise).
using TensorPut = std::function<void(GgufWriter&, const std::string&, const std::vector<int64_t>&, const std::vector<float>&)>;

void add_experts(GgufWriter& w, const Family& fam, const std::string& name, const std::vector<int64_t>& shape,
                 const std::vector<float>& v, const TensorPut& put) {
    const std::string pre = "model.layers.";
    const size_t dot = name.find('.', pre.size());
    const std::string blk = "blk." + name.substr(pre.size(), dot - pre.size()) + ".";
    const std::string part = name.substr(name.find(".mlp.experts.") + 13);
    const int64_t N = shape[0];
    if (part == "gate_up_proj" || part == "gate_up_proj_bias") {
        const bool bias = part == "gate_up_proj_bias";
        const int64_t E = bias ? 1 : shape[1], I = shape[bias ? 1 : 2] / 2;
        std::vector<float> gate(size_t(N * I * E)), up(gate.size());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t i = 0; i < I; ++i)
                for (int64_t e = 0; e < E; ++e) {
                    gate[size_t((n * I + i) * E + e)] = v[size_t((n * E + e) * 2 * I + 2 * i)];
                    up[size_t((n * I + i) * E + e)] = v[size_t((n * E + e) * 2 * I + 2 * i + 1)];
                }
        const std::string sfx = bias ? ".bias" : ".weight";
        if (fam.variant) {
            std::vector<float> both;
            for (int64_t n = 0; n < N; ++n) {
                both.insert(both.end(), gate.begin() + n * I * E, gate.begin() + (n + 1) * I * E);
                both.insert(both.end(), up.begin() + n * I * E, up.begin() + (n + 1) * I * E);
            }
            put(w, blk + "ffn_gate_up_exps" + sfx, bias ? std::vector<int64_t>{N, 2 * I} : std::vector<int64_t>{N, 2 * I, E},
                both);
        } else {
            const std::vector<int64_t> s = bias ? std::vector<int64_t>{N, I} : std::vector<int64_t>{N, I, E};
            put(w, blk + "ffn_gate_exps" + sfx, s, gate);
            put(w, blk + "ffn_up_exps" + sfx, s, up);
        }
    } else if (part == "down_proj") {
        const int64_t I = shape[1], E = shape[2];
        std::vector<float> t(v.size());
        for (int64_t n = 0; n < N; ++n)
            for (int64_t i = 0; i < I; ++i)
                for (int64_t e = 0; e < E; ++e) t[size_t((n * E + e) * I + i)] = v[size_t((n * I + i) * E + e)];
        put(w, blk + "ffn_down_exps.weight", {N, E, I}, t);
    } else if (part == "down_proj_bias") {
        put(w, blk + "ffn_down_exps.bias", shape, v);
    } else {
        throw Error(str("test: no llama.cpp name for ", name));
    }
}

// DeepseekV2Model.modify_tensors: kv_b_proj viewed as [NH, D_nope + D_v, r] and split into
// attn_k_b = the key rows transposed, [NH, r, D_nope], and attn_v_b = the value rows, [NH, D_v, r].
void add_split_kv_b(GgufWriter& w, const ModelConfig& c, const std::string& name, const std::vector<float>& v) {
    const int64_t NH = c.num_heads, r = c.latent.kv_lora_rank, Dn = c.latent.qk_nope_head_dim, Dv = c.latent.v_head_dim;
    std::vector<float> kb(size_t(NH * r * Dn)), vb(size_t(NH * Dv * r));
    for (int64_t h = 0; h < NH; ++h)
        for (int64_t col = 0; col < r; ++col) {
            for (int64_t j = 0; j < Dn; ++j) kb[size_t((h * r + col) * Dn + j)] = v[size_t((h * (Dn + Dv) + j) * r + col)];
            for (int64_t j = 0; j < Dv; ++j) vb[size_t((h * Dv + j) * r + col)] = v[size_t((h * (Dn + Dv) + Dn + j) * r + col)];
        }
    const std::string pre = "model.layers.";
    const std::string blk = "blk." + name.substr(pre.size(), name.find('.', pre.size()) - pre.size()) + ".";
    w.add_float_tensor(blk + "attn_k_b.weight", {NH, r, Dn}, kb);
    w.add_float_tensor(blk + "attn_v_b.weight", {NH, Dv, r}, vb);
}

std::string write_gguf(const Family& fam, const HfModelFolder& hf, const std::string& dir,
                       const std::function<void(GgufWriter&)>& edit = {}, const TensorPut& experts_put = {},
                       const std::string& file_name = "", GgmlType matrix_type = GgmlType::F32) {
    const ModelConfig& c = hf.config;
    const std::string a = fam.arch;
    GgufWriter w;
    w.set("general.architecture", GgufValue::of_string(a));
    w.set(a + ".block_count", GgufValue::of_u32(uint32_t(c.num_layers)));
    w.set(a + ".context_length", GgufValue::of_u32(uint32_t(c.max_position_embeddings)));
    w.set(a + ".embedding_length", GgufValue::of_u32(uint32_t(c.hidden_size)));
    w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(c.intermediate_size)));
    w.set(a + ".attention.head_count", GgufValue::of_u32(uint32_t(c.num_heads)));
    w.set(a + ".attention.head_count_kv", GgufValue::of_u32(uint32_t(c.num_kv_heads)));
    w.set(a + ".attention.key_length", GgufValue::of_u32(uint32_t(c.head_dim)));
    w.set(a + ".attention.value_length", GgufValue::of_u32(uint32_t(c.head_dim)));
    w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::of_f32(float(c.rms_norm_eps)));
    w.set(a + ".rope.freq_base", GgufValue::of_f32(float(c.rope_theta)));
    w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(c.rope_dims())));
    w.set(a + ".vocab_size", GgufValue::of_u32(uint32_t(c.vocab_size)));
    int64_t window = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) window = std::max<int64_t>(window, c.layer_window(l));
    if (window > 0) w.set(a + ".attention.sliding_window", GgufValue::of_u32(uint32_t(window)));
    if (a == "gemma2") {
        w.set(a + ".attn_logit_softcapping", GgufValue::of_f32(float(c.attn_logit_softcap)));
        w.set(a + ".final_logit_softcapping", GgufValue::of_f32(float(c.final_logit_softcap)));
    }
    if (a == "deepseek2") {  // DeepseekV2Model.set_gguf_parameters, newer (MLA) and older forms
        const LatentAttention& la = c.latent;
        w.set(a + ".attention.kv_lora_rank", GgufValue::of_u32(uint32_t(la.kv_lora_rank)));
        if (la.q_lora_rank > 0) w.set(a + ".attention.q_lora_rank", GgufValue::of_u32(uint32_t(la.q_lora_rank)));
        w.set(a + ".rope.dimension_count", GgufValue::of_u32(uint32_t(la.qk_rope_head_dim)));
        w.set(a + ".leading_dense_block_count", GgufValue::of_u32(uint32_t(c.num_layers)));  // first_k_dense_replace
        w.set(a + ".expert_count", GgufValue::of_u32(4));         // the fixtures' n_routed_experts, n_shared_experts,
        w.set(a + ".expert_shared_count", GgufValue::of_u32(1));  // moe_intermediate_size (unused: every layer is dense)
        w.set(a + ".expert_feed_forward_length", GgufValue::of_u32(16));
        if (fam.variant) {
            w.set(a + ".attention.key_length", GgufValue::of_u32(uint32_t(la.qk_nope_head_dim + la.qk_rope_head_dim)));
            w.set(a + ".attention.value_length", GgufValue::of_u32(uint32_t(la.v_head_dim)));
        } else {
            w.set(a + ".attention.head_count_kv", GgufValue::of_u32(1));
            w.set(a + ".attention.key_length", GgufValue::of_u32(uint32_t(la.kv_lora_rank + la.qk_rope_head_dim)));
            w.set(a + ".attention.value_length", GgufValue::of_u32(uint32_t(la.kv_lora_rank)));
            w.set(a + ".attention.key_length_mla", GgufValue::of_u32(uint32_t(la.qk_nope_head_dim + la.qk_rope_head_dim)));
            w.set(a + ".attention.value_length_mla", GgufValue::of_u32(uint32_t(la.v_head_dim)));
        }
    }
    if (a == "lfm2") {  // LFM2Model.set_gguf_parameters: head_count_kv 0 in the convolution layers
        std::vector<int32_t> kv;
        for (int64_t l = 0; l < c.num_layers; ++l) kv.push_back(c.short_conv_layer(l) ? 0 : int32_t(c.num_kv_heads));
        w.set(a + ".attention.head_count_kv", GgufValue::of_i32_array(kv));
        w.set(a + ".shortconv.l_cache", GgufValue::of_u32(uint32_t(c.conv_kernel)));
        // _add_feed_forward_length's adjusted width, the formula hf_config.cpp shares with it
        w.set(a + ".feed_forward_length", GgufValue::of_u32(uint32_t(c.intermediate_size)));
    }
    if (c.has_experts()) {
        w.set(a + ".expert_count", GgufValue::of_u32(uint32_t(c.moe.num_experts)));
        w.set(a + ".expert_used_count", GgufValue::of_u32(uint32_t(c.moe.top_k)));
        w.set(a + ".expert_feed_forward_length", GgufValue::of_u32(uint32_t(c.intermediate_size)));
    }
    const bool gemma = a == "gemma2" || a == "gemma3";
    auto ends = [](const std::string& s, const std::string& tail) {
        return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    // LFM2 from the checkpoint's own names (kvlab's HF loader renames them to Llama's).
    const TensorMap raw = a == "lfm2" ? load_safetensors(fixture_dir(fam) + "/model.safetensors").tensors : TensorMap{};
    for (const auto& [name, t] : a == "lfm2" ? raw : hf.weights) {
        std::vector<float> v = t.to_f32_vector();
        std::vector<int64_t> shape;
        for (int d = 0; d < t.ndim(); ++d) shape.push_back(t.size(d));
        if (a == "lfm2" && ends(name, "conv.conv.weight")) shape = {shape[0], shape[2]};  // LFM2Model: squeeze(1)
        if (name.find(".mlp.experts.") != std::string::npos) {
            add_experts(
                w, fam, name, shape, v,
                experts_put ? experts_put
                            : [](GgufWriter& g, const std::string& n, const std::vector<int64_t>& sh,
                                 const std::vector<float>& x) { g.add_float_tensor(n, sh, x); });
            continue;
        }
        if (a == "deepseek2" && !fam.variant && ends(name, "self_attn.kv_b_proj.weight")) {
            add_split_kv_b(w, c, name, v);
            continue;
        }
        const std::string g = llama_cpp_name(a, name);
        if (g.empty()) throw Error(str("test: no llama.cpp name for ", name));
        // convert_hf_to_gguf.py's Gemma2Model / Gemma3Model: norm weights + 1.
        if (gemma && ends(name, "norm.weight"))
            for (float& x : v) x += 1.0f;
        // LlamaModel.modify_tensors (SmolLM3Model is one): q and k rows permuted per head.
        if (a == "smollm3" && ends(name, "self_attn.q_proj.weight")) v = llama_permute(v, shape, c.num_heads);
        if (a == "smollm3" && ends(name, "self_attn.k_proj.weight")) v = llama_permute(v, shape, c.num_kv_heads);
        w.add_float_tensor(g, shape, v, shape.size() == 2 ? matrix_type : GgmlType::F32);
    }
    if (edit) edit(w);
    const std::string path = dir + "/" + (file_name.empty() ? family_name(fam) : file_name) + ".gguf";
    w.write(path);
    return path;
}

class GgufFamily : public testing::TestWithParam<Family> {};

TEST_P(GgufFamily, LogitsMatchThePyTorchFixture) {
    const Family fam = GetParam();
    const std::string dir = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + fam.fixture;
    const HfModelFolder hf = load_hf_model_folder(dir);
    const SafetensorsContents expected = load_safetensors(dir + "/expected.safetensors");
    const std::string tmp = (std::filesystem::temp_directory_path() / ("kvlab_gguf_families_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    const std::string path = write_gguf(fam, hf, tmp);
    GgufModel g = load_gguf_model(path);
    std::filesystem::remove_all(tmp);

    // The layer layout and particulars equal the HF folder's (the norm offset aside: the file
    // holds 1 + w).
    const ModelConfig &gc = g.config, &hc = hf.config;
    EXPECT_EQ(gc.arch, hc.arch);
    EXPECT_EQ(gc.norm_placement, hc.norm_placement);
    EXPECT_EQ(gc.qk_norm, hc.qk_norm);
    EXPECT_EQ(gc.qk_norm_whole, hc.qk_norm_whole);
    EXPECT_EQ(gc.fused_projections, hc.fused_projections);
    EXPECT_EQ(gc.mlp_act, hc.mlp_act);
    EXPECT_DOUBLE_EQ(gc.embedding_scale, hc.embedding_scale);
    EXPECT_DOUBLE_EQ(gc.query_scale(), hc.query_scale());
    EXPECT_DOUBLE_EQ(gc.attn_logit_softcap, hc.attn_logit_softcap);
    EXPECT_DOUBLE_EQ(gc.final_logit_softcap, hc.final_logit_softcap);
    EXPECT_EQ(gc.tie_word_embeddings, hc.tie_word_embeddings);
    EXPECT_EQ(gc.qkv_bias, hc.qkv_bias);
    EXPECT_EQ(gc.o_bias, hc.o_bias);
    EXPECT_EQ(gc.attention_sinks, hc.attention_sinks);
    EXPECT_EQ(gc.moe.num_experts, hc.moe.num_experts);
    EXPECT_EQ(gc.moe.top_k, hc.moe.top_k);
    EXPECT_DOUBLE_EQ(gc.moe.limit, hc.moe.limit);
    EXPECT_DOUBLE_EQ(gc.moe.alpha, hc.moe.alpha);
    EXPECT_EQ(gc.intermediate_size, hc.intermediate_size);
    EXPECT_EQ(gc.attn_projection, hc.attn_projection);
    EXPECT_EQ(gc.num_kv_heads, hc.num_kv_heads);
    EXPECT_EQ(gc.head_dim, hc.head_dim);
    EXPECT_EQ(gc.latent.q_lora_rank, hc.latent.q_lora_rank);
    EXPECT_EQ(gc.latent.kv_lora_rank, hc.latent.kv_lora_rank);
    EXPECT_EQ(gc.latent.qk_nope_head_dim, hc.latent.qk_nope_head_dim);
    EXPECT_EQ(gc.latent.qk_rope_head_dim, hc.latent.qk_rope_head_dim);
    EXPECT_EQ(gc.latent.v_head_dim, hc.latent.v_head_dim);
    EXPECT_EQ(gc.conv_kernel, hc.conv_kernel);
    for (int64_t l = 0; l < hc.num_layers; ++l) {
        EXPECT_EQ(gc.layer_spec(l).mixer, hc.layer_spec(l).mixer) << "layer " << l;
        EXPECT_EQ(gc.layer_spec(l).attention, hc.layer_spec(l).attention) << "layer " << l;
        EXPECT_EQ(gc.layer_spec(l).mlp, hc.layer_spec(l).mlp) << "layer " << l;
        EXPECT_EQ(gc.layer_window(l), hc.layer_window(l)) << "layer " << l;
        EXPECT_EQ(gc.layer_rope_dims(l), hc.layer_rope_dims(l)) << "layer " << l;
        EXPECT_FLOAT_EQ(float(gc.layer_spec(l).rope_theta), float(hc.layer_spec(l).rope_theta)) << "layer " << l;
    }

    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(g.config, g.tensors, opt);
    model.set_context_width(std::stoll(expected.metadata.at("context_width")));
    const int inputs = std::stoi(expected.metadata.at("inputs"));
    for (int j = 0; j < inputs; ++j) {
        const Tensor& ids = expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = expected.tensors.at("logits." + std::to_string(j));
        test::Comparison cmp = test::compare(model.forward(ids), want);
        EXPECT_FALSE(cmp.nonfinite_mismatch) << cmp.report;
        EXPECT_LE(cmp.rel_err, 1e-5) << fam.fixture << " input " << j << "\n" << cmp.report;
    }
}

// The CLI keeps a GGUF file's matrices packed (--model.weights packed): with every matrix stored
// as F16, the packed load runs each family within F16's rounding of the fixture's logits (latent
// attention and the short convolution take theirs dequantized, the experts are 3-D and stay so).
TEST_P(GgufFamily, PackedF16MatricesRun) {
    const Family fam = GetParam();
    const HfModelFolder hf = load_hf_model_folder(fixture_dir(fam));
    const SafetensorsContents expected = load_safetensors(fixture_dir(fam) + "/expected.safetensors");
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kvlab_gguf_f16_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    GgufLoadOptions lo;
    lo.packed = true;
    GgufModel g = load_gguf_model(write_gguf(fam, hf, tmp, {}, {}, "f16", GgmlType::F16), lo);
    std::filesystem::remove_all(tmp);
    int packed = 0;
    for (const auto& [name, t] : g.tensors) packed += t.dtype() == DType::U8;
    EXPECT_GT(packed, 0) << "no matrix stayed packed";
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(g.config, g.tensors, opt);
    model.set_context_width(std::stoll(expected.metadata.at("context_width")));
    test::Comparison cmp = test::compare(model.forward(expected.tensors.at("input_ids.0")), expected.tensors.at("logits.0"));
    EXPECT_LE(cmp.rel_err, 1e-2) << cmp.report;
}

INSTANTIATE_TEST_SUITE_P(Families, GgufFamily,
                         testing::Values(Family{"gemma3_gguf_layout", "gemma3"}, Family{"gemma2_gguf_layout", "gemma2"},
                                         Family{"phi3_partial", "phi3"}, Family{"olmo2_postnorm", "olmo2"},
                                         Family{"smollm3_nope", "smollm3"}, Family{"gpt_oss_sinks", "gpt-oss"},
                                         Family{"gpt_oss_moe", "gpt-oss"}, Family{"gpt_oss_moe", "gpt-oss", true},
                                         Family{"deepseek_v2_mla", "deepseek2"}, Family{"deepseek_v2_lite_mla", "deepseek2"},
                                         Family{"deepseek_v2_lite_mla", "deepseek2", true}, Family{"lfm2_hybrid", "lfm2"}),
                         [](const testing::TestParamInfo<Family>& i) { return family_name(i.param); });

// What the loader cannot run is refused by name: Phi-3 LongRoPE factors, windowed OLMo layers.
TEST(GgufFamilyErrors, LongRopeAndWindowedOlmoAreRefused) {
    const std::string tmp = (std::filesystem::temp_directory_path() / ("kvlab_gguf_errors_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    auto message = [&](const Family& fam, const std::function<void(GgufWriter&)>& edit) {
        const HfModelFolder hf = load_hf_model_folder(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + fam.fixture);
        try {
            load_gguf_model(write_gguf(fam, hf, tmp, edit));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    const std::string lr = message(Family{"phi3_partial", "phi3"}, [](GgufWriter& w) {
        w.add_float_tensor("rope_factors_long.weight", {4}, {1.0f, 2.0f, 3.0f, 4.0f});
    });
    EXPECT_NE(lr.find("Phi-3 LongRoPE (rope_factors_long / rope_factors_short) is not supported"), std::string::npos) << lr;
    const std::string ow = message(Family{"olmo2_postnorm", "olmo2"}, [](GgufWriter& w) {
        w.set("olmo2.attention.sliding_window", GgufValue::of_u32(4));
    });
    EXPECT_NE(ow.find("olmo2.attention.sliding_window"), std::string::npos) << ow;
    EXPECT_NE(ow.find("windowed OLMo layers"), std::string::npos) << ow;
    std::filesystem::remove_all(tmp);
}

// OCP MX v1.0 MXFP4 as ggml's block_mxfp4 holds it, encoded here from the definition: per 32
// values an E8M0 byte (scale 2^(byte - 127), the largest power of two with amax / scale < 8),
// then 16 bytes, value j in the low nibble and j + 16 in the high; a nibble is a sign bit over
// an E2M1 magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6} (the nearest; ties to the smaller).
std::vector<uint8_t> mxfp4_encode(const std::vector<float>& x, std::vector<float>& decoded) {
    static const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    std::vector<uint8_t> out;
    decoded.assign(x.size(), 0.0f);
    for (size_t b = 0; b < x.size(); b += 32) {
        double amax = 0;
        for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(double(x[i])));
        const int e = amax > 0 ? int(std::floor(std::log2(amax))) - 2 : -127;
        const double scale = std::ldexp(1.0, e);
        out.push_back(uint8_t(e + 127));
        uint8_t nib[32];
        for (size_t i = 0; i < 32; ++i) {
            const double y = double(x[b + i]) / scale;
            int best = 0;
            for (int m = 1; m < 8; ++m)
                if (std::fabs(std::fabs(y) - kE2M1[m]) < std::fabs(std::fabs(y) - kE2M1[best])) best = m;
            nib[i] = uint8_t(best | (y < 0 ? 8 : 0));
            decoded[b + i] = float((y < 0 ? -1.0 : 1.0) * kE2M1[best] * scale);
        }
        for (size_t j = 0; j < 16; ++j) out.push_back(uint8_t(nib[j] | (nib[j + 16] << 4)));
    }
    return out;
}

// gpt-oss's released GGUF files hold the experts as MXFP4. The fixture's gate and up experts
// (rows of 32) stored as MXFP4 load to the same logits as the values decoded above stored as
// F32; and those differ from the fixture's (the quantization did happen).
TEST(GgufFamilyMxfp4, GptOssExpertsInMxfp4) {
    const Family fam{"gpt_oss_moe", "gpt-oss"};
    const std::string dir = fixture_dir(fam);
    const HfModelFolder hf = load_hf_model_folder(dir);
    const SafetensorsContents expected = load_safetensors(dir + "/expected.safetensors");
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kvlab_gguf_mxfp4_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    auto quantized = [](bool as_mxfp4) {
        return [as_mxfp4](GgufWriter& w, const std::string& n, const std::vector<int64_t>& shape, const std::vector<float>& x) {
            const bool gate_up =
                n.find("ffn_gate_exps.weight") != std::string::npos || n.find("ffn_up_exps.weight") != std::string::npos;
            if (!gate_up) return w.add_float_tensor(n, shape, x);
            std::vector<float> decoded;
            std::vector<uint8_t> blocks = mxfp4_encode(x, decoded);
            if (!as_mxfp4) return w.add_float_tensor(n, shape, decoded);
            w.add_tensor(n, GgmlType::MXFP4, {shape[2], shape[1], shape[0]}, std::move(blocks));
        };
    };
    GgufModel q = load_gguf_model(write_gguf(fam, hf, tmp, {}, quantized(true), "mxfp4"));
    GgufModel f = load_gguf_model(write_gguf(fam, hf, tmp, {}, quantized(false), "decoded"));
    std::filesystem::remove_all(tmp);
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer mq(q.config, q.tensors, opt), mf(f.config, f.tensors, opt);
    const Tensor& ids = expected.tensors.at("input_ids.0");
    const Tensor lq = mq.forward(ids), lf = mf.forward(ids);
    test::Comparison same = test::compare(lq, lf);
    EXPECT_LE(same.rel_err, 1e-6) << same.report;
    test::Comparison moved = test::compare(lq, expected.tensors.at("logits.0"));
    EXPECT_GT(moved.rel_err, 1e-5) << "the MXFP4 experts gave the unquantized logits";
}

// gpt-oss's YaRN as GptOssModel.set_gguf_parameters writes it (rope.scaling.type yarn, .factor,
// .original_context_length) gives the model of the same config.json with that rope_scaling.
TEST(GgufFamilyYarn, GptOssYarnMatchesTheConfig) {
    const Family fam{"gpt_oss_moe", "gpt-oss"};
    const HfModelFolder hf = load_hf_model_folder(fixture_dir(fam));
    std::ifstream in(fixture_dir(fam) + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    std::string json = text.str();
    json.insert(json.find('{') + 1,
                R"("rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 16},)");
    ModelConfig want = parse_model_config(json, "config.json with yarn");
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kvlab_gguf_yarn_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    GgufModel g = load_gguf_model(write_gguf(fam, hf, tmp, [](GgufWriter& w) {
        w.set("gpt-oss.rope.scaling.type", GgufValue::of_string("yarn"));
        w.set("gpt-oss.rope.scaling.factor", GgufValue::of_f32(8.0f));
        w.set("gpt-oss.rope.scaling.original_context_length", GgufValue::of_u32(16));
    }));
    std::filesystem::remove_all(tmp);
    EXPECT_EQ(g.config.rope_scaling.type, "yarn");
    EXPECT_DOUBLE_EQ(g.config.rope_scaling.factor, want.rope_scaling.factor);
    EXPECT_EQ(g.config.rope_scaling.original_max_position_embeddings, want.rope_scaling.original_max_position_embeddings);
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer mg(g.config, g.tensors, opt), mh(want, hf.weights, opt);
    const SafetensorsContents expected = load_safetensors(fixture_dir(fam) + "/expected.safetensors");
    const Tensor& ids = expected.tensors.at("input_ids.0");
    const Tensor lg = mg.forward(ids), lh = mh.forward(ids);
    EXPECT_LE(test::compare(lg, lh).rel_err, 1e-6);
    EXPECT_GT(test::compare(lg, expected.tensors.at("logits.0")).rel_err, 1e-5) << "YaRN changed nothing";
}

// A DeepSeek-V2 file holding attn_kv_b beside the halves attn_k_b / attn_v_b is read through
// attn_kv_b (the halves, zero here, are not used).
TEST(GgufFamilyLatent, KvBWinsOverItsHalves) {
    const Family fam{"deepseek_v2_lite_mla", "deepseek2", true};
    const HfModelFolder hf = load_hf_model_folder(fixture_dir(fam));
    const ModelConfig& c = hf.config;
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kvlab_gguf_kvb_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    GgufModel g = load_gguf_model(write_gguf(fam, hf, tmp, [&c](GgufWriter& w) {
        const int64_t NH = c.num_heads, r = c.latent.kv_lora_rank, Dn = c.latent.qk_nope_head_dim, Dv = c.latent.v_head_dim;
        for (int64_t l = 0; l < c.num_layers; ++l) {
            w.add_float_tensor(str("blk.", l, ".attn_k_b.weight"), {NH, r, Dn}, std::vector<float>(size_t(NH * r * Dn)));
            w.add_float_tensor(str("blk.", l, ".attn_v_b.weight"), {NH, Dv, r}, std::vector<float>(size_t(NH * Dv * r)));
        }
    }));
    std::filesystem::remove_all(tmp);
    const SafetensorsContents expected = load_safetensors(fixture_dir(fam) + "/expected.safetensors");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(g.config, g.tensors, opt);
    model.set_context_width(std::stoll(expected.metadata.at("context_width")));
    test::Comparison cmp = test::compare(model.forward(expected.tensors.at("input_ids.0")), expected.tensors.at("logits.0"));
    EXPECT_LE(cmp.rel_err, 1e-5) << cmp.report;
}

// SmolLM3, gpt-oss, DeepSeek-V2 and LFM2: a missing or contradictory key names the key and what
// was expected; what kvlab cannot run is refused by name.
TEST(GgufFamilyErrors, SmolLM3GptOssDeepSeekLfm2Metadata) {
    const std::string tmp =
        (std::filesystem::temp_directory_path() / ("kvlab_gguf_errors3_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(tmp);
    auto message = [&](const Family& fam, const std::function<void(GgufWriter&)>& edit) {
        const HfModelFolder hf = load_hf_model_folder(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + fam.fixture);
        try {
            load_gguf_model(write_gguf(fam, hf, tmp, edit));
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("no error");
    };
    auto expect_has = [](const std::string& m, const std::vector<std::string>& parts) {
        for (const std::string& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
    };
    const Family moe{"gpt_oss_moe", "gpt-oss"}, smol{"smollm3_nope", "smollm3"};
    expect_has(message(moe, [](GgufWriter& w) { w.remove("gpt-oss.expert_used_count"); }),
               {"metadata key 'gpt-oss.expert_used_count' is missing, expected the number of experts run per token"});
    expect_has(message(moe, [](GgufWriter& w) { w.remove("gpt-oss.attention.sliding_window"); }),
               {"metadata key 'gpt-oss.attention.sliding_window' is missing, expected the window of gpt-oss's sliding layers"});
    expect_has(message(moe, [](GgufWriter& w) { w.set("gpt-oss.expert_used_count", GgufValue::of_u32(5)); }),
               {"gpt-oss.expert_used_count", "is 5, expected at most gpt-oss.expert_count = 4"});
    expect_has(message(moe, [](GgufWriter& w) { w.set("gpt-oss.expert_count", GgufValue::of_u32(3)); }),
               {"blk.0.ffn_down_exps.weight", "has shape [4, 32, 48]", "expected [3, 32, 48] from the metadata"});
    expect_has(message(smol, [](GgufWriter& w) { w.set("smollm3.attention.sliding_window", GgufValue::of_u32(4)); }),
               {"smollm3.attention.sliding_window", "windowed SmolLM3 layers are not supported from GGUF"});
    const Family ds{"deepseek_v2_mla", "deepseek2"}, lfm{"lfm2_hybrid", "lfm2"};
    expect_has(message(ds, [](GgufWriter& w) { w.set("deepseek2.leading_dense_block_count", GgufValue::of_u32(1)); }),
               {"deepseek2.leading_dense_block_count", "is 1; DeepSeek-V2's mixture-of-experts MLP is not supported",
                "expected at least deepseek2.block_count = 3"});
    expect_has(message(ds, [](GgufWriter& w) { w.remove("deepseek2.attention.kv_lora_rank"); }),
               {"metadata key 'deepseek2.attention.kv_lora_rank' is missing, expected the width of the key/value latent"});
    expect_has(message(ds, [](GgufWriter& w) { w.set("deepseek2.attention.value_length", GgufValue::of_u32(7)); }),
               {"deepseek2.attention.key_length / deepseek2.attention.value_length are 20 / 7",
                "expected kv_lora_rank + rope.dimension_count = 20 / kv_lora_rank = 12"});
    expect_has(message(ds,
                       [](GgufWriter& w) {
                           w.set("deepseek2.rope.scaling.type", GgufValue::of_string("yarn"));
                           w.set("deepseek2.rope.scaling.factor", GgufValue::of_f32(4.0f));
                       }),
               {"deepseek2.rope.scaling.type", "is 'yarn'; DeepSeek's YaRN", "expected no rope scaling"});
    expect_has(message(lfm,
                       [](GgufWriter& w) {
                           w.set("lfm2.attention.head_count_kv", GgufValue::of_i32_array({0, 2, 0}));
                       }),
               {"lfm2.attention.head_count_kv", "lists 3 layers, expected block_count = 4"});
    expect_has(
        message(lfm,
                [](GgufWriter& w) {
                    w.set("lfm2.attention.head_count_kv", GgufValue::of_i32_array({0, 2, 0, 1}));
                }),
        {"lfm2.attention.head_count_kv", "entry 3 is 1, expected 0 (a convolution layer) or the other attention layers' 2"});
    expect_has(message(lfm, [](GgufWriter& w) { w.remove("lfm2.shortconv.l_cache"); }),
               {"metadata key 'lfm2.shortconv.l_cache' is missing, expected the short convolution's width"});
    std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace kv
