// Gemma 3n's text decoder: the config reader against Gemma3nTextConfig's rules, the normal
// quantile of the gaussian top-k against known values and its own definition, refusals.
// (Logits against tools/reference/gemma3n_reference.py's float64 forward, whole and chunked:
// ModelFixture/gemma3n_text and ModelFixtureLayers.ChunkedThroughDenseCacheMatchesReference;
// KV sharing through h2o: KvSharing.*.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/model/altup.h"
#include "engine/model/head_norm_rows.h"
#include "engine/model/model_loader.h"
#include "engine/model/transformer.h"
#include "engine/ops/ops.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "formats/io/safetensors_write.h"
#include "tests/engine/fixture_bounds.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

std::string fixture_config() {
    std::ifstream f(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/gemma3n_text/config.json");
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

TEST(Gemma3nConfig, FixtureFieldsFollowTransformers) {
    const ModelConfig c = parse_model_config(fixture_config(), "config.json");
    EXPECT_EQ(c.arch, Arch::GEMMA3N);
    EXPECT_EQ(c.norm_placement, NormPlacement::BOTH);
    EXPECT_EQ(c.norm_weight_offset, 0.0);  // Gemma3nRMSNorm multiplies by w
    EXPECT_TRUE(c.qk_norm && c.v_norm);
    EXPECT_DOUBLE_EQ(c.query_scale(), 1.0);  // scaling=1.0
    EXPECT_DOUBLE_EQ(c.final_logit_softcap, 2.0);
    EXPECT_DOUBLE_EQ(c.embedding_scale, std::sqrt(32.0));
    EXPECT_EQ(c.intermediate_size, 48);  // a list of one width per layer
    EXPECT_EQ(c.altup.num_inputs, 3);
    EXPECT_EQ(c.altup.laurel_rank, 4);
    EXPECT_EQ(c.altup.per_layer_dim, 8);
    EXPECT_EQ(c.residual_width(), 3 * 32 + 6 * 8);
    const int window[] = {5, 5, 0, 5, 5, 0};
    const int source[] = {0, 1, 2, 1, 1, 2};
    for (int l = 0; l < 6; ++l) {
        EXPECT_EQ(c.layer_window(l), window[l]) << l;
        EXPECT_EQ(c.kv_layer(l), source[l]) << l;
        EXPECT_EQ(c.layer_spec(l).rope_theta, window[l] ? 1e4 : 1e6) << l;
        EXPECT_EQ(c.layer_spec(l).activation_sparsity, l < 2 ? 0.95 : 0.0) << l;
    }
}

// The defaults: 35 layers, full iff (i + 1) % 5 == 0, the last 15 shared, sparsity 0.95 in the
// first 10 layers, window 512, cap 30, 4 streams.
TEST(Gemma3nConfig, DefaultsAreGemma3nTextConfigs) {
    const ModelConfig c = parse_model_config(
        R"({"model_type": "gemma3n_text", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 35,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
            "vocab_size_per_layer_input": 97, "hidden_size_per_layer_input": 4, "laurel_rank": 2})",
        "config.json");
    EXPECT_EQ(c.altup.num_inputs, 4);
    EXPECT_DOUBLE_EQ(c.final_logit_softcap, 30.0);
    for (int64_t l = 0; l < 35; ++l) {
        const bool full = (l + 1) % 5 == 0;
        EXPECT_EQ(c.layer_window(l), full ? 0 : 512) << l;
        EXPECT_EQ(c.layer_spec(l).activation_sparsity, l < 10 ? 0.95 : 0.0) << l;
        // first shared layer 20: sliding layers read 18, full ones 19
        EXPECT_EQ(c.kv_layer(l), l < 20 ? l : (full ? 19 : 18)) << l;
    }
}

std::string refusal(const std::string& extra) {
    try {
        parse_model_config(R"({"model_type": "gemma3n_text", "vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 4,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
                               "vocab_size_per_layer_input": 97, "hidden_size_per_layer_input": 4, "laurel_rank": 2, )" +
                               extra + "}",
                           "config.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(Gemma3nConfig, RefusesWhatItCannotRunByName) {
    EXPECT_NE(refusal(R"("intermediate_size": [48, 48, 64, 48])").find("MLP widths that differ by layer (MatFormer) are not supported"),
              std::string::npos);
    EXPECT_NE(refusal(R"("intermediate_size": 48, "num_kv_shared_layers": 5)").find("num_kv_shared_layers"), std::string::npos);
    // Layer 3 (full) shared from layer 2 on, but no full layer before it.
    const std::string m = refusal(R"("intermediate_size": 48, "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"])");
    EXPECT_NE(m.find("makes layer 3 (full_attention) shared, but no earlier layer of that type keeps its own keys and values"),
              std::string::npos)
        << m;
    EXPECT_NE(refusal(R"("intermediate_size": 48, "activation_sparsity_pattern": [0.5])").find("activation_sparsity_pattern"),
              std::string::npos);
    EXPECT_EQ(refusal(R"("intermediate_size": 48, "num_kv_shared_layers": 0)"), "");
}

TEST(Gemma3nSparsity, NormalQuantileMatchesItsDefinition) {
    EXPECT_NEAR(normal_quantile(0.95), 1.6448536269514722, 1e-14);
    EXPECT_NEAR(normal_quantile(0.025), -1.959963984540054, 1e-14);
    EXPECT_NEAR(normal_quantile(0.5), 0.0, 1e-15);
    for (double p : {1e-9, 1e-4, 0.01, 0.3, 0.7, 0.99, 0.999999}) {
        const double x = normal_quantile(p);
        EXPECT_NEAR(0.5 * std::erfc(-x / std::sqrt(2.0)), p, 1e-15 + 1e-12 * p) << p;
    }
    EXPECT_THROW(normal_quantile(1.0), Error);
}

// The gaussian top-k in place on the gate half of a gate/up projection (a strided view, as the
// MLP hands it over), f32 and f64, against its definition in float64: relu(g - mean - std z),
// z = Phi^-1(0.95) rounded to float32 as transformers evaluates it; the up half is untouched.
TEST(Gemma3nSparsity, GaussianTopkInPlaceMatchesItsDefinition) {
    const int64_t B = 2, n = 3, I = 37;
    const double z = double(float(1.6448536269514722));
    std::vector<double> v(size_t(B * n * 2 * I));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7 * double(i) + 0.3) * (1.0 + double(i % 5)) + 0.1;
    for (DType dt : {DType::F32, DType::F64}) {
        SCOPED_TRACE(dt == DType::F32 ? "f32" : "f64");
        Tensor gu = Tensor::from_f64({B, n, 2 * I}, v, dt);
        const std::vector<double> in = gu.to_f64_vector();  // the values as stored (f32-rounded)
        Tensor gate = gu.slice(2, 0, I);
        gaussian_topk_(gate, 0.95);
        const std::vector<double> got = gu.to_f64_vector();
        int zeros = 0;
        for (int64_t r = 0; r < B * n; ++r) {
            const double* g = in.data() + r * 2 * I;
            double mean = 0, var = 0;
            for (int64_t i = 0; i < I; ++i) mean += g[i] / double(I);
            for (int64_t i = 0; i < I; ++i) var += (g[i] - mean) * (g[i] - mean) / double(I);
            const double cut = mean + std::sqrt(var) * z;
            for (int64_t i = 0; i < I; ++i) {
                const double want = std::max(0.0, g[i] - cut);
                zeros += want == 0.0;
                EXPECT_NEAR(got[size_t(r * 2 * I + i)], want, (dt == DType::F32 ? 1e-6 : 1e-13) * (1.0 + std::abs(g[i])));
                EXPECT_EQ(got[size_t(r * 2 * I + I + i)], g[I + i]);  // the up half
            }
        }
        EXPECT_GT(zeros, int(B * n * I / 2));  // most channels cut at the 95th percentile
    }
}

// The released checkpoints' form: model_type gemma3n with the decoder in text_config, its
// tensors under model.language_model., beside tensors of the other towers. The fixture rewritten
// so loads as the fixture and gives its logits.
TEST(Gemma3nFolder, MultimodalCheckpointLoadsItsTextDecoder) {
    namespace fs = std::filesystem;
    const fs::path src = fs::path(KVLAB_SOURCE_DIR) / "tests/fixtures/models/gemma3n_text";
    const fs::path dir = fs::temp_directory_path() / ("kvlab_gemma3n_mm_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"model_type": "gemma3n", "architectures": ["Gemma3nForConditionalGeneration"],
        "vision_config": {"model_type": "gemma3n_vision"}, "audio_config": {"model_type": "gemma3n_audio"},
        "torch_dtype": "float32", "text_config": )" << fixture_config() << "}";
    TensorMap w;
    for (auto& [name, t] : load_safetensors((src / "model.safetensors").string()).tensors)
        w["model.language_model." + name.substr(std::string("model.").size())] = t;
    w["model.vision_tower.timm_model.conv_stem.conv.weight"] = Tensor::from_f64({2, 2}, {1, 2, 3, 4}, DType::F32);
    w["model.embed_audio.embedding.weight"] = Tensor::from_f64({2, 2}, {1, 2, 3, 4}, DType::F32);
    write_safetensors((dir / "model.safetensors").string(), w);
    const HfModelFolder mf = load_hf_model_folder(dir.string());
    EXPECT_EQ(mf.config.arch, Arch::GEMMA3N);
    EXPECT_EQ(mf.config.kv_layer(5), 2);
    ModelOptions opt;
    Transformer model(mf.config, mf.weights, opt);
    model.set_context_width(64);
    const SafetensorsContents expected = load_safetensors((src / "expected.safetensors").string());
    const test::Comparison c = test::compare(model.forward(expected.tensors.at("input_ids.0")), expected.tensors.at("logits.0"));
    EXPECT_LE(c.rel_err, test::f32_fixture_tol("gemma3n_text")) << c.report;
    fs::remove_all(dir);
}

// A block run for the reverse pass (saving its activations) computes what the plain block does and
// keeps AltUp's prediction and the core's input and output, LAUREL's branch and the top-k gate's
// input (gradients: grad_fd_test's Gemma3nGradient.*).
TEST(Gemma3nFolder, BlockSavesWhatItsReversePassReads) {
    const HfModelFolder mf = load_hf_model_folder(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/gemma3n_text");
    Transformer model(mf.config, mf.weights, ModelOptions{});
    const Tensor ids = Tensor::from_i64({1, 3}, {1, 2, 3});
    const Tensor x = model.embed(ids);
    EXPECT_EQ(x.size(2), mf.config.residual_width());
    PlainAttention plain, plain2;
    BlockActivations acts;
    const Tensor saved = model.block(0, x, 0, plain, &acts);
    const Tensor plain_out = model.block(0, x, 0, plain2);
    EXPECT_EQ(saved.to_f64_vector(), plain_out.to_f64_vector());
    const int64_t E = mf.config.hidden_size, A = mf.config.altup.num_inputs;
    EXPECT_EQ(acts.altup_pred.shape(), (Shape{3, A, E}));
    EXPECT_EQ(acts.altup_active.shape(), (Shape{1, 3, E}));
    EXPECT_EQ(acts.altup_out.shape(), (Shape{1, 3, E}));
    EXPECT_EQ(acts.laurel_left.shape(), (Shape{1, 3, mf.config.altup.laurel_rank}));
    EXPECT_EQ(acts.laurel_r.shape(), (Shape{1, 3, E}));
    ASSERT_GT(mf.config.layer_spec(0).activation_sparsity, 0.0);
    EXPECT_EQ(acts.gate_pre.shape(), (Shape{1, 3, mf.config.intermediate_size}));
}

// The f32 activation path (AltUp's per-token maps in f32 per ISA level, the correction recomputing
// the prediction) against the f64 path (every map in double) on the tiny-gemma3n preset, whose
// four streams take the four-stream loops the fixture (three) does not; bf16 activations too.
// KVLAB_CPU_VARIANT=avx2 / base runs the narrower builds of the same loops.
TEST(Gemma3nPrecision, F32AndBf16ForwardsFollowTheF64Forward) {
    ModelOptions o64, o32, o16;
    o64.dtype = DType::F64, o32.dtype = DType::F32, o16.dtype = DType::BF16;
    const LoadedModel m64 = load_model("tiny-gemma3n", o64, 7), m32 = load_model("tiny-gemma3n", o32, 7),
                      m16 = load_model("tiny-gemma3n", o16, 7);
    ASSERT_EQ(m32.config.altup.num_inputs, 4);
    std::vector<int64_t> v(40);
    for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t(3 + (i * 37) % 250);
    const Tensor ids = Tensor::from_i64({2, 20}, v);
    const Tensor ref = m64.model->forward(ids);
    const test::Comparison c32 = test::compare(m32.model->forward(ids), ref);
    EXPECT_LE(c32.rel_err, 1e-4) << c32.report;
    const test::Comparison c16 = test::compare(m16.model->forward(ids).to(DType::F64), ref);
    EXPECT_FALSE(c16.nonfinite_mismatch) << c16.report;
    EXPECT_LE(c16.rel_err, 5e-2) << c16.report;
    std::printf("tiny-gemma3n logits vs the f64 forward: f32 %.3g, bf16 %.3g (max |err| / max |ref|)\n", c32.rel_err, c16.rel_err);
}

// With f32 activations a block run for the reverse pass keeps every stream's prediction while a
// plain block recomputes them in the correction: both give the same bits (four streams).
TEST(Gemma3nPrecision, SavedAndPlainBlocksAgreeWithFourStreams) {
    const LoadedModel lm = load_model("tiny-gemma3n", ModelOptions{}, 11);
    const Tensor x = lm.model->embed(Tensor::from_i64({1, 5}, {1, 2, 3, 4, 5}));
    for (int l = 0; l < 2; ++l) {
        PlainAttention plain, plain2;
        BlockActivations acts;
        const Tensor saved = lm.model->block(l, x, 0, plain, &acts);
        EXPECT_EQ(saved.to_f64_vector(), lm.model->block(l, x, 0, plain2).to_f64_vector()) << "layer " << l;
        EXPECT_EQ(acts.altup_pred.shape(), (Shape{5, 4, lm.config.hidden_size}));
    }
}

// forward() runs Gemma 3n's f32 blocks with each AltUp correction also making the next layer's
// prediction, and LAUREL's residual as one row loop: the logits must be the bits of block() run
// layer by layer (altup_predict, block_core, altup_correct as separate passes), KV sharing included.
TEST(Gemma3nPrecision, ForwardGivesTheBitsOfBlockByBlock) {
    const LoadedModel lm = load_model("tiny-gemma3n", ModelOptions{}, 5);
    ASSERT_TRUE(lm.config.any_kv_shared());
    std::vector<int64_t> v(2 * 33);
    for (size_t i = 0; i < v.size(); ++i) v[i] = int64_t((i * 53 + 7) % 256);
    const Tensor ids = Tensor::from_i64({2, 33}, v);
    PlainAttention plain;
    std::vector<int> sources;
    for (int64_t l = 0; l < lm.config.num_layers; ++l)
        if (lm.config.kv_shared(l)) sources.push_back(int(lm.config.kv_layer(l)));
    plain.retain(sources);
    Tensor x = lm.model->embed(ids);
    for (int l = 0; l < int(lm.config.num_layers); ++l) x = lm.model->block(l, x, 0, plain);
    const Tensor want = lm.model->lm_head(lm.model->final_norm(x));
    EXPECT_EQ(lm.model->forward(ids).to_f64_vector(), want.to_f64_vector());
}

// The LAUREL residual's one-pass row loop against the separate ops it replaces, from their
// definitions: (x + RMSNorm(o) (off + w_post) + h + RMSNorm(r) w_laurel) / sqrt(2), in double.
TEST(Gemma3nPrecision, LaurelResidualFollowsItsDefinition) {
    const LoadedModel lm = load_model("tiny-gemma3n", ModelOptions{}, 9);
    const ModelConfig& c = lm.config;
    const LayerWeights& L = lm.model->layer(1);
    const int64_t E = c.hidden_size, n = 7;
    auto rnd = [&](uint64_t seed) {
        std::vector<double> r(size_t(n * E));
        for (size_t i = 0; i < r.size(); ++i) r[i] = std::sin(double(i) * 0.37 + double(seed)) * (1.0 + double(i % 5));
        return r;
    };
    const std::vector<double> xv = rnd(1), ov = rnd(2), hv = rnd(3);
    const Tensor x = Tensor::from_f64({1, n, E}, xv, DType::F32), o = Tensor::from_f64({1, n, E}, ov, DType::F32),
                 h = Tensor::from_f64({1, n, E}, hv, DType::F32);
    Tensor left, r;
    const std::vector<double> got = laurel_residual(c, L, x, o, h, DType::F32, &left, &r).to_f64_vector();
    const std::vector<double> rv = r.to_f64_vector(), pw = L.attn_post_norm.to_f64_vector(), lw = L.laurel_norm.to_f64_vector();
    double worst = 0;
    for (int64_t t = 0; t < n; ++t) {
        double so = 0, sr = 0;
        for (int64_t e = 0; e < E; ++e) {
            const double ot = double(float(ov[size_t(t * E + e)])), rt = rv[size_t(t * E + e)];
            so += ot * ot, sr += rt * rt;
        }
        const double io = 1 / std::sqrt(so / double(E) + c.rms_norm_eps), ir = 1 / std::sqrt(sr / double(E) + c.rms_norm_eps);
        for (int64_t e = 0; e < E; ++e) {
            const size_t i = size_t(t * E + e);
            const double want = (double(float(xv[i])) + double(float(ov[i])) * io * (c.norm_weight_offset + pw[size_t(e)]) +
                                 double(float(hv[i])) + rv[i] * ir * lw[size_t(e)]) /
                                std::sqrt(2.0);
            worst = std::max(worst, std::abs(got[i] - want) / (1.0 + std::abs(want)));
        }
    }
    EXPECT_LE(worst, 1e-5);
}

// Gemma 3n's q/k/v head norms in one pass over the projection against RMSNorm's definition per
// head in double; rows enough for the parallel split, heads with their own weights.
TEST(Gemma3nPrecision, HeadNormsFollowTheirDefinition) {
    const int64_t rows = 300, heads = 12, hs = 32, W = heads * hs;
    const float eps = 1e-6f;
    std::vector<float> x(static_cast<size_t>(rows * W)), w(static_cast<size_t>(W)), y(static_cast<size_t>(rows * W));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(double(i) * 0.61) * (1.0 + double(i % 7)));
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(0.5 + std::cos(double(i) * 0.3));
    head_norm_rows::normalise(x.data(), rows, heads, hs, w.data(), eps, y.data());
    double worst = 0;
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t h = 0; h < heads; ++h) {
            const int64_t b = t * W + h * hs;
            double ss = 0;
            for (int64_t i = 0; i < hs; ++i) ss += double(x[size_t(b + i)]) * double(x[size_t(b + i)]);
            const double inv = 1 / std::sqrt(ss / double(hs) + double(eps));
            for (int64_t i = 0; i < hs; ++i) {
                const double want = double(x[size_t(b + i)]) * inv * double(w[size_t(h * hs + i)]);
                worst = std::max(worst, std::abs(double(y[size_t(b + i)]) - want) / (1.0 + std::abs(want)));
            }
        }
    EXPECT_LE(worst, 1e-6);
}

// The MLP's residual add making AltUp's correction coefficients in the same pass (f32) against
// the separate steps: ops::rmsnorm and ops::add, then altup_correct computing them itself.
TEST(Gemma3nPrecision, PostMlpCoefficientsMatchTheSeparateSteps) {
    const LoadedModel lm = load_model("tiny-gemma3n", ModelOptions{}, 13);
    const ModelConfig& c = lm.config;
    const int64_t E = c.hidden_size, n = 9;
    const Tensor x = lm.model->embed(Tensor::from_i64({1, n}, {5, 9, 17, 33, 65, 129, 200, 3, 1}));
    const int l = 1;
    const LayerWeights& L = lm.model->layer(l);
    const AltUpPrediction p = altup_predict(c, L, x, DType::F32, false);
    std::vector<double> dv(size_t(n * E)), ov(size_t(n * E));
    for (size_t i = 0; i < dv.size(); ++i) dv[i] = std::sin(double(i) * 0.23) * 3.0, ov[i] = std::cos(double(i) * 0.11);
    const Tensor d = Tensor::from_f64({1, n, E}, dv, DType::F32), out0 = Tensor::from_f64({1, n, E}, ov, DType::F32);
    const Tensor out_ref = ops::add(out0, ops::rmsnorm(d, L.mlp_post_norm, float(c.rms_norm_eps), float(c.norm_weight_offset)));
    const Tensor next_ref = altup_correct(c, L, l, x, p, out_ref, DType::F32);
    Tensor out = out0.clone();
    AltUpCoefs co;
    ASSERT_TRUE(altup_post_mlp(c, L, p.active, d, out, DType::F32, &co));
    const Tensor next = altup_correct(c, L, l, x, p, out, DType::F32, nullptr, nullptr, &co);
    const test::Comparison ca = test::compare(out, out_ref), cn = test::compare(next, next_ref);
    EXPECT_LE(ca.rel_err, 1e-6) << ca.report;
    EXPECT_LE(cn.rel_err, 1e-6) << cn.report;
    AltUpCoefs none;  // bf16 activations take the separate steps
    Tensor ob = out0.to(DType::BF16);
    EXPECT_FALSE(altup_post_mlp(c, L, p.active, d.to(DType::BF16), ob, DType::BF16, &none));
}

}  // namespace
}  // namespace kv
