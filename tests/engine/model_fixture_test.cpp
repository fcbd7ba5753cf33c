// The transformer against the independent PyTorch reference (tools/reference/model_reference.py):
// tiny Llama (GQA), Llama with YaRN (context 4x the training length), Qwen2 (q/k/v bias, MQA,
// tied), Qwen3 (q/k norm, head_dim != hidden/heads) and a bf16 checkpoint. Logits must match
// within 1e-5 (f32) / 2e-2 (bf16) of max |logit|.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/io/hf_folder.h"
#include "engine/io/safetensors_file.h"
#include "engine/model/transformer.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

const char* kFixtureMagic = "kvlab-model-fixture";
const char* kFixtureVersion = "1";

struct Fixture {
    HfModelFolder model;
    SafetensorsContents expected;
    int64_t context_width = 0;
    int inputs = 0;
};

Fixture load_fixture(const std::string& name) {
    const std::string dir = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name;
    Fixture f;
    f.model = load_hf_model_folder(dir);
    f.expected = load_safetensors(dir + "/expected.safetensors");
    const auto& m = f.expected.metadata;
    if (!m.count("magic") || m.at("magic") != kFixtureMagic || m.at("version") != kFixtureVersion)
        throw Error(str(dir, ": fixture version mismatch (want ", kFixtureVersion, ")"),
                    "regenerate with: /usr/bin/python3 tools/reference/model_reference.py --out tests/fixtures/models");
    f.context_width = std::stoll(m.at("context_width"));
    f.inputs = std::stoi(m.at("inputs"));
    return f;
}

class ModelFixture : public testing::TestWithParam<std::string> {};

TEST_P(ModelFixture, LogitsMatchPyTorchReference) {
    Fixture f = load_fixture(GetParam());
    const bool bf16 = f.model.config.dtype == DType::BF16;
    ModelOptions opt;
    opt.dtype = bf16 ? DType::BF16 : DType::F32;
    opt.rope = RopeMode::YARN;
    Transformer model(f.model.config, f.model.weights, opt);
    model.set_context_width(f.context_width);
    // f32: rounding of f32 accumulation over a few hundred terms; bf16: activations stored in
    // bf16 (8 mantissa bits) through 2 layers.
    const double tol = bf16 ? 2e-2 : 1e-5;
    for (int j = 0; j < f.inputs; ++j) {
        const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = f.expected.tensors.at("logits." + std::to_string(j));
        Tensor got = model.forward(ids);
        test::Comparison c = test::compare(got, want);
        EXPECT_FALSE(c.nonfinite_mismatch) << c.report;
        EXPECT_LE(c.rel_err, tol) << GetParam() << " input " << j << "\n" << c.report;
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixture,
                         testing::Values("llama_gqa", "llama_yarn", "qwen2_bias_mqa", "qwen3_qknorm", "llama_bf16"));

TEST(ModelFixtureMeta, YarnFixtureReallyUsesYarn) {
    // The YaRN fixture's context (256) exceeds the training length (64): s = 4, so the
    // frequencies and the attention scale differ from plain RoPE.
    Fixture f = load_fixture("llama_yarn");
    RopeFrequencies y = rope_frequencies(f.model.config, f.context_width, RopeMode::YARN);
    RopeFrequencies p = rope_frequencies(f.model.config, f.context_width, RopeMode::PLAIN);
    EXPECT_DOUBLE_EQ(y.yarn_s, 4.0);
    EXPECT_NE(y.attn_scale, p.attn_scale);
    EXPECT_NE(y.inv_freq.back(), p.inv_freq.back());
}

}  // namespace
}  // namespace kv
