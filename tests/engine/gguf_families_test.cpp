// GGUF files of Gemma 2, Gemma 3, Phi-3 and OLMo 2 with llama.cpp's metadata and tensor names,
// converted here from the PyTorch fixtures (tests/fixtures/models) as llama.cpp's
// convert_hf_to_gguf.py does: its names per architecture (written out below, not taken from
// kvlab's table), Gemma's norm weights stored as 1 + w, no Q/K permutation (these families use
// NeoX RoPE). Loaded by kvlab's GGUF loader, each must give the fixture's float64 PyTorch
// logits within 1e-5 of max |logit| and the HF folder's layer layout.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include <unistd.h>

#include "engine/model/transformer.h"
#include "formats/gguf/gguf_model.h"
#include "formats/gguf/gguf_writer.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

struct Family {
    const char* fixture;
    const char* arch;  // llama.cpp's general.architecture
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.fixture; }

// llama.cpp's tensor name of an HF tensor of this family (convert_hf_to_gguf.py / gguf-py's
// tensor_mapping.py), "" for none.
std::string llama_cpp_name(const std::string& arch, const std::string& hf) {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    const std::string pre = "model.layers.";
    if (hf.rfind(pre, 0) != 0) return "";
    const size_t dot = hf.find('.', pre.size());
    const std::string layer = hf.substr(pre.size(), dot - pre.size()), part = hf.substr(dot + 1);
    const bool gemma = arch == "gemma2" || arch == "gemma3";
    const std::map<std::string, std::string> common = {
        {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  {"mlp.gate_proj.weight", "ffn_gate.weight"},
        {"mlp.up_proj.weight", "ffn_up.weight"},           {"mlp.gate_up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},       {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"input_layernorm.weight", "attn_norm.weight"},
        {"post_feedforward_layernorm.weight", "ffn_post_norm.weight"},
        {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    };
    std::string g;
    if (part == "post_attention_layernorm.weight") g = gemma || arch == "olmo2" ? "attn_post_norm.weight" : "ffn_norm.weight";
    else if (common.count(part)) g = common.at(part);
    return g.empty() ? "" : "blk." + layer + "." + g;
}

std::string write_gguf(const Family& fam, const HfModelFolder& hf, const std::string& dir,
                       const std::function<void(GgufWriter&)>& edit = {}) {
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
    const bool gemma = a == "gemma2" || a == "gemma3";
    for (const auto& [name, t] : hf.weights) {
        const std::string g = llama_cpp_name(a, name);
        if (g.empty()) throw Error(str("test: no llama.cpp name for ", name));
        std::vector<float> v = t.to_f32_vector();
        // convert_hf_to_gguf.py's Gemma2Model / Gemma3Model: norm weights + 1.
        if (gemma && name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0)
            for (float& x : v) x += 1.0f;
        std::vector<int64_t> shape;
        for (int d = 0; d < t.ndim(); ++d) shape.push_back(t.size(d));
        w.add_float_tensor(g, shape, v);
    }
    if (edit) edit(w);
    const std::string path = dir + "/" + fam.fixture + ".gguf";
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
    for (int64_t l = 0; l < hc.num_layers; ++l) {
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

INSTANTIATE_TEST_SUITE_P(Families, GgufFamily,
                         testing::Values(Family{"gemma3_gguf_layout", "gemma3"}, Family{"gemma2_gguf_layout", "gemma2"},
                                         Family{"phi3_partial", "phi3"}, Family{"olmo2_postnorm", "olmo2"}),
                         [](const testing::TestParamInfo<Family>& i) { return std::string(i.param.fixture); });

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

}  // namespace
}  // namespace kv
