// The transformer against the independent PyTorch reference (tools/reference/model_reference.py):
// tiny Llama (GQA), Llama with YaRN (context 4x the training length), Qwen2 (q/k/v bias, MQA,
// tied), Qwen3 (q/k norm, head_dim != hidden/heads), a bf16 checkpoint, and sliding windows
// shorter than the sequence: Mistral (window 5, every layer) and Qwen2 (window 4 in layers >=
// max_window_layers = 1), Gemma 3 (sliding and full layers interleaved, per-layer RoPE base,
// q/k norm, query_pre_attn_scalar, (1 + w) norms on both sides of attention and MLP, GELU-tanh,
// scaled tied embeddings), Gemma 2 (alternating layers), SmolLM3 (a NoPE layer), Phi-3 (partial
// rotary, fused projections, window), OLMo 2 (output norms, q/k norm over the projection),
// gpt-oss attention (learned sinks, alternating sliding/full layers, biases), gpt-oss with its
// mixture of experts (4 experts, 2 per token, the clamped SwiGLU's clamps acting) and Phi-3
// LongRoPE (short and long factors), LFM2's hybrid, DeepSeek-V2's MLA and Gemma 3n's text decoder.
// Logits must match within 1e-5 (f32; Gemma 3n 3e-5, fixture_bounds.h) / 2e-2 (bf16) of max |logit|.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "engine/driver/long_context.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "engine/train/model_weights.h"
#include "tests/engine/chunked_logits_util.h"
#include "tests/engine/fixture_bounds.h"
#include "tests/engine/fixture_driver_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {
using test::drive_next_token;
using test::fixture_chunk_plan;

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
    const double tol = bf16 ? 2e-2 : test::f32_fixture_tol(GetParam());
    for (int j = 0; j < f.inputs; ++j) {
        const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = f.expected.tensors.at("logits." + std::to_string(j));
        Tensor got = model.forward(ids);
        test::Comparison c = test::compare(got, want);
        EXPECT_FALSE(c.nonfinite_mismatch) << c.report;
        EXPECT_LE(c.rel_err, tol) << GetParam() << " input " << j << "\n" << c.report;
    }
}

// The f64 forward against the same float64 references (f32 weights are the references' own
// inputs): what is left is the attention scale, which reaches the SDPA as an f32 parameter
// (1/sqrt(D) rounded: ~3e-8 relative on the scores). Gemma 3n was 4.7e-6 off while the RoPE
// tables were f32 in the f64 forward too; its f32 forward's larger error (test::f32_fixture_tol) is
// rounding the fixture amplifies, not a step of different math.
TEST(ModelFixtureF64, ForwardMatchesPyTorchReference) {
    for (const std::string name : {"llama_gqa", "llama_yarn", "qwen2_bias_mqa", "qwen3_qknorm", "mistral_window", "qwen2_window",
                                   "gemma3_interleaved", "gemma2_alternating", "smollm3_nope", "phi3_partial", "olmo2_postnorm",
                                   "gemma2_softcap", "gpt_oss_sinks", "phi3_longrope_short", "phi3_longrope_long", "phi3_longrope_full",
                                   "gemma3_gguf_layout", "gemma2_gguf_layout", "deepseek_v2_mla", "deepseek_v2_lite_mla", "lfm2_hybrid",
                                   "gemma3n_text", "gpt_oss_moe"}) {  // every fixture but llama_bf16 (bf16 activations)
        Fixture f = load_fixture(name);
        ModelOptions opt;
        opt.dtype = DType::F64;
        opt.rope = RopeMode::YARN;
        Transformer model(f.model.config, f.model.weights, opt);
        model.set_context_width(f.context_width);
        for (int j = 0; j < f.inputs; ++j) {
            const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
            test::Comparison c = test::compare(model.forward(ids), f.expected.tensors.at("logits." + std::to_string(j)));
            EXPECT_LE(c.rel_err, 3e-7) << name << " input " << j << "\n" << c.report;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelFixture,
                         testing::Values("llama_gqa", "llama_yarn", "qwen2_bias_mqa", "qwen3_qknorm", "llama_bf16",
                                         "mistral_window", "qwen2_window", "gemma3_interleaved", "gemma2_alternating",
                                         "smollm3_nope", "phi3_partial", "olmo2_postnorm", "gemma2_softcap", "gpt_oss_sinks",
                                         "phi3_longrope_short", "phi3_longrope_long", "phi3_longrope_full", "gemma3_gguf_layout",
                                         "gemma2_gguf_layout", "deepseek_v2_mla", "deepseek_v2_lite_mla", "lfm2_hybrid",
                                         "gemma3n_text", "gpt_oss_moe"));

// Gemma's layers differ from each other: whole sequence through a dense cache in chunks of 1,
// 7 and 32 (the last longer than every window, shorter than the 37-token input) must equal the
// one-pass reference, so each layer masks with its own window and rotates with its own base.
// Every input of fixture f (named `name`) through a dense cache of `dtype` (the model's too) in
// each of `chunks` against the one-pass reference, within tol.
void expect_chunked_through_dense_cache(const std::string& name, const Fixture& f, DType dtype, double tol,
                                        std::initializer_list<int64_t> chunks = {1, 7, 32}) {
    ModelOptions opt;
    opt.dtype = dtype;
    opt.rope = RopeMode::YARN;
    Transformer model(f.model.config, f.model.weights, opt);
    model.set_context_width(f.context_width);
    for (int j = 0; j < f.inputs; ++j) {
        const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = f.expected.tensors.at("logits." + std::to_string(j));
        const int64_t T = ids.size(1), V = want.size(2);
        for (int64_t chunk : chunks) {
            SCOPED_TRACE(str(name, " input ", j, " chunk ", chunk));
            KVCacheConfig kc;  // dense-default: keeps every position
            KVCache cache(kc, f.model.config, Device{}, dtype, T);
            test::Comparison c = test::compare(test::chunked_logits(model, f.model.config, ids, chunk, V, &cache), want);
            EXPECT_FALSE(c.nonfinite_mismatch) << c.report;
            EXPECT_LE(c.rel_err, tol) << c.report;
        }
    }
}

TEST(ModelFixtureLayers, ChunkedThroughDenseCacheMatchesReference) {
    for (const std::string name : {"gemma3_interleaved", "gemma2_alternating", "smollm3_nope", "phi3_partial", "olmo2_postnorm",
                                   "gemma2_softcap", "gpt_oss_sinks", "phi3_longrope_long", "deepseek_v2_mla", "deepseek_v2_lite_mla",
                                   "lfm2_hybrid", "gemma3n_text", "gpt_oss_moe"})
        expect_chunked_through_dense_cache(name, load_fixture(name), DType::F32, test::f32_fixture_tol(name));
}

// The f64 forward through an f64 dense cache in chunks of 1, 7 and 32: every layer type's
// cache path in the precision of the references (within 1e-6, Gemma 3n too).
TEST(ModelFixtureF64, ChunkedThroughDenseCacheMatchesReference) {
    for (const std::string name : {"mistral_window", "qwen2_window", "gemma3_interleaved", "gemma2_alternating", "smollm3_nope",
                                   "phi3_partial", "olmo2_postnorm", "gemma2_softcap", "gpt_oss_sinks", "phi3_longrope_long",
                                   "deepseek_v2_mla", "deepseek_v2_lite_mla", "lfm2_hybrid", "gemma3n_text", "gpt_oss_moe"})
        expect_chunked_through_dense_cache(name, load_fixture(name), DType::F64, 1e-6);
}

// Gemma 2's soft-capping (attention 0.5, final logits 2.0: both saturate) against transformers'
// own Gemma2ForCausalLM, eager attention in float64 (tools/reference/transformers_check.py wrote
// its logits beside the fixture), one chunk and chunks of 32 through a cache.
TEST(ModelFixtureSoftcap, MatchesTransformersEagerGemma2) {
    Fixture f = load_fixture("gemma2_softcap");
    ASSERT_EQ(f.model.config.attn_logit_softcap, 0.5);
    ASSERT_EQ(f.model.config.final_logit_softcap, 2.0);
    const SafetensorsContents hf =
        load_safetensors(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/gemma2_softcap/transformers.safetensors");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.model.config, f.model.weights, opt);
    model.set_context_width(f.context_width);
    for (int j = 0; j < f.inputs; ++j) {
        const Tensor& ids = f.expected.tensors.at("input_ids." + std::to_string(j));
        const Tensor& want = hf.tensors.at("logits." + std::to_string(j));
        const int64_t T = ids.size(1), V = want.size(2);
        for (int64_t chunk : {T, int64_t(32)}) {
            SCOPED_TRACE(str("input ", j, " chunk ", chunk));
            KVCacheConfig kc;
            KVCache cache(kc, f.model.config, Device{}, DType::F32, T);
            test::Comparison c = test::compare(test::chunked_logits(model, f.model.config, ids, chunk, V, &cache), want);
            EXPECT_LE(c.rel_err, 1e-5) << c.report;
        }
    }
}

// The layer description read from the fixtures' config.json against transformers' rule,
// written out here: layer i is sliding iff (i + 1) % pattern != 0 (Gemma 3: sliding_window_pattern,
// Gemma 2: 2); Gemma 3 rotates sliding layers with rope_local_base_freq.
// Phi-3 LongRoPE (8 pairs, long factors: a 37-token sequence past the original 32) against
// transformers' own Phi3ForCausalLM (4.44.2, eager, float64 weights; its LongRoPE angles and
// cos/sin are float32, 1.2e-6 of max |logit| from the float64 reference), one chunk and chunks
// of 32 through a cache (kvlab keeps the long factors for the whole run, the context width
// being 64; transformers' one-pass logits are the reference).
TEST(ModelFixtureLongRope, MatchesTransformersEagerPhi3) {
    Fixture f = load_fixture("phi3_longrope_full");
    ASSERT_EQ(f.model.config.rope_scaling.type, "longrope");
    ASSERT_EQ(f.model.config.rope_scaling.original_max_position_embeddings, 32);
    const SafetensorsContents hf =
        load_safetensors(std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/phi3_longrope_full/transformers.safetensors");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(f.model.config, f.model.weights, opt);
    model.set_context_width(f.context_width);
    const Tensor& ids = f.expected.tensors.at("input_ids.0");
    const Tensor& want = hf.tensors.at("logits.0");
    const int64_t T = ids.size(1), V = want.size(2);
    for (int64_t chunk : {T, int64_t(32)}) {
        SCOPED_TRACE(str("chunk ", chunk));
        KVCacheConfig kc;
        KVCache cache(kc, f.model.config, Device{}, DType::F32, T);
        test::Comparison c = test::compare(test::chunked_logits(model, f.model.config, ids, chunk, V, &cache), want);
        EXPECT_LE(c.rel_err, 1e-5) << c.report;
    }
}

TEST(ModelFixtureLayers, GemmaLayerTypesFollowTransformers) {
    const ModelConfig g3 = load_fixture("gemma3_interleaved").model.config;
    ASSERT_EQ(g3.num_layers, 4);
    for (int64_t l = 0; l < 4; ++l) {
        const bool sliding = (l + 1) % 3 != 0;
        const LayerSpec s = g3.layer_spec(l);
        EXPECT_EQ(s.attention, sliding ? AttnKind::SLIDING : AttnKind::GLOBAL) << l;
        EXPECT_EQ(g3.layer_window(l), sliding ? 5 : 0) << l;
        EXPECT_EQ(s.rope_theta, sliding ? 10000.0 : 1000000.0) << l;
    }
    EXPECT_EQ(g3.norm_placement, NormPlacement::BOTH);
    EXPECT_EQ(g3.norm_weight_offset, 1.0);
    EXPECT_DOUBLE_EQ(g3.embedding_scale, std::sqrt(32.0));
    EXPECT_TRUE(g3.qk_norm);
    EXPECT_DOUBLE_EQ(g3.query_scale(), 1.0 / std::sqrt(24.0));
    const ModelConfig g2 = load_fixture("gemma2_alternating").model.config;
    for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(g2.layer_window(l), l % 2 == 0 ? 4 : 0) << l;
    EXPECT_FALSE(g2.qk_norm);
    EXPECT_EQ(g2.attn_logit_softcap, 0.0);  // null in the fixture
}

// The model's state dict (checkpoints, saving) names every tensor as the family's checkpoint
// does: the fixture's model.safetensors, tensor for tensor (Gemma's four norms, OLMo 2's output
// norms, Phi-3's fused projections).
TEST(ModelFixtureLayers, StateDictHasTheCheckpointsNamesAndValues) {
    for (const std::string name : {"gemma3_interleaved", "gemma2_alternating", "smollm3_nope", "phi3_partial", "olmo2_postnorm",
                                   "gemma2_softcap", "gpt_oss_sinks", "gpt_oss_moe"}) {
        Fixture f = load_fixture(name);
        Transformer model(f.model.config, f.model.weights, ModelOptions{});
        const TensorMap sd = model_state_dict(model);
        EXPECT_EQ(sd.size(), f.model.weights.size()) << name;
        for (const auto& [n, t] : f.model.weights) {
            auto it = sd.find(n);
            ASSERT_NE(it, sd.end()) << name << ": " << n;
            EXPECT_EQ(it->second.to_f64_vector(), t.to_f64_vector()) << name << ": " << n;
        }
    }
}

// SmolLM3Config: no_rope_layers[i] = int((i + 1) % 4 != 0) by default, 1 = the layer rotates.
// Phi-3: half of the 16 channels rotated, every layer windowed.
TEST(ModelFixtureLayers, NoPeAndPartialRotaryFollowTransformers) {
    const ModelConfig s = load_fixture("smollm3_nope").model.config;
    for (int64_t l = 0; l < s.num_layers; ++l) EXPECT_EQ(s.layer_rope_dims(l), (l + 1) % 4 != 0 ? 8 : 0) << l;
    const ModelConfig p = load_fixture("phi3_partial").model.config;
    EXPECT_TRUE(p.fused_projections);
    for (int64_t l = 0; l < p.num_layers; ++l) {
        EXPECT_EQ(p.layer_rope_dims(l), 8) << l;
        EXPECT_EQ(p.layer_window(l), 6) << l;
    }
    const ModelConfig o = load_fixture("olmo2_postnorm").model.config;
    EXPECT_EQ(o.norm_placement, NormPlacement::POST);
    EXPECT_TRUE(o.qk_norm && o.qk_norm_whole);
}

// The windowed fixtures fed through a dense KV cache in chunks shorter than the window, longer
// than it, and one token at a time (the decode path): the window must mask keys the cache
// still holds, so the logits equal the one-chunk reference.
TEST(ModelFixtureWindow, ChunkedThroughDenseCacheMatchesReference) {
    for (const std::string name : {"mistral_window", "qwen2_window"}) {
        const Fixture f = load_fixture(name);
        ASSERT_GT(f.model.config.sliding_window, 0) << name;
        for (int j = 0; j < f.inputs; ++j)
            ASSERT_GT(f.expected.tensors.at("input_ids." + std::to_string(j)).size(1), f.model.config.sliding_window) << name;
        expect_chunked_through_dense_cache(name, f, DType::F32, 1e-5, {1, 3, 7});
    }
}

// Observes every attention call of a windowed model run through an evicting cache: after the
// cache attends, recomputes each query's attention in f64 over the slots the cache holds,
// restricted to keys inside the expected window (position p sees kpos in (p - window, p];
// the window is the test's, not the one the model passes), and records the largest difference
// from the cache's output. It also counts held keys the window hides, so a test can confirm
// the cache really kept keys outside the window.
class WindowCheck final : public CacheAttention {
   public:
    WindowCheck(KVCache& cache, int expected_window) : cache_(cache), expected_(expected_window) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    using CacheAttention::attend;
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y, const ChunkInput& in) override {
        cache_.attend(layer, q, k, v, input_pos, scale, window, y, in);
        windows.push_back(window);
        window = expected_;
        LayerCache& lc = cache_.layer(layer);
        const KVPolicy& pol = lc.policy();
        const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = k.size(1), R = NH / G;
        const int64_t T = pol.current_length(), L = pol.cache_length();
        auto [K, V] = lc.buffer().read(T);
        const std::vector<double> qv = q.contiguous().to_f64_vector(), yv = y.contiguous().to_f64_vector();
        const std::vector<double> Kv = K.contiguous().to_f64_vector(), Vv = V.contiguous().to_f64_vector();
        const std::vector<int32_t>& pos = pol.token_positions();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h) {
                const int64_t g = h / R;
                const int32_t* p = pos.data() + (pol.per_row_positions() ? (b * G + g) * L : 0);
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t qp = input_pos + i;
                    const double* qi = qv.data() + ((b * NH + h) * n + i) * D;
                    std::vector<double> s(size_t(T), -INFINITY);
                    double m = -INFINITY;
                    for (int64_t t = 0; t < T; ++t) {
                        if (p[t] < 0 || p[t] > qp) continue;
                        if (window > 0 && p[t] <= qp - window) {
                            hidden_held += input_pos > 0;  // kept past a prefill: the policy's choice
                            continue;
                        }
                        const double* kt = Kv.data() + ((b * G + g) * T + t) * D;
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kt[d];
                        s[size_t(t)] = dot * double(scale);
                        m = std::max(m, s[size_t(t)]);
                    }
                    double den = 0;
                    std::vector<double> out(size_t(D), 0.0);
                    for (int64_t t = 0; t < T; ++t) {
                        if (s[size_t(t)] == -INFINITY) continue;
                        const double w = std::exp(s[size_t(t)] - m);
                        den += w;
                        for (int64_t d = 0; d < D; ++d) out[size_t(d)] += w * Vv[size_t(((b * G + g) * T + t) * D + d)];
                    }
                    for (int64_t d = 0; d < D; ++d) {
                        const double want = out[size_t(d)] / den, got = yv[size_t(((b * NH + h) * n + i) * D + d)];
                        max_err = std::max(max_err, std::fabs(got - want));
                        max_ref = std::max(max_ref, std::fabs(want));
                    }
                }
            }
    }
    std::vector<int> windows;  // the window of every call, in call order
    int64_t hidden_held = 0;   // (query, held key) pairs the window hid
    double max_err = 0, max_ref = 0;

   private:
    KVCache& cache_;
    int expected_;
};

// eval_long's driver with h2o on the windowed Mistral: the cache (8 slots) keeps heavy hitters
// older than the window (5), and every layer's attention must still see only the window.
TEST(ModelFixtureWindow, H2oCacheNeverAttendsOutsideTheWindow) {
    Fixture f = load_fixture("mistral_window");
    const ModelConfig& mc = f.model.config;
    Transformer model(f.model.config, f.model.weights, ModelOptions{});
    const Tensor& ids = f.expected.tensors.at("input_ids.1");  // (1, 23)
    const int64_t T = ids.size(1);
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = 8;
    KVCache cache(kc, mc, Device{}, DType::F32, T);
    ASSERT_EQ(mc.sliding_window, 5);  // the fixture's config.json
    WindowCheck check(cache, 5);
    const ChunkPlan plan = fixture_chunk_plan(T);  // a prefill of 6 tokens, then chunks of 2 and single tokens
    const HeadResult res = drive_next_token(model, cache, ids, plan, check);
    ASSERT_EQ(check.windows.size(), plan.chunks.size() * size_t(mc.num_layers));
    for (int w : check.windows) EXPECT_EQ(w, 5);
    EXPECT_GT(check.hidden_held, 0) << "the cache never held a key outside the window: the test would not bite";
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << "max |y - windowed f64 attention| " << check.max_err;
    EXPECT_TRUE(std::isfinite(res.loss_sum[0]) && res.count[0] == double(T - 1));
}

// Quest's page kernel has no window: on a windowed layer it must refuse, never attend beyond.
// Quest reads pages only on the full-attention layers: windowed layers keep their window by
// rule (sdpa_quest_ has no window, and a window needs no selection). On the Gemma 3 fixture
// (layers 0, 1, 3 windowed, 5 tokens) quest runs; with every page selected it equals the
// PyTorch reference.
TEST(ModelFixtureWindow, QuestReadsOnlyFullAttentionLayers) {
    Fixture f = load_fixture("gemma3_interleaved");
    const ModelConfig& mc = f.model.config;
    ModelOptions opt;
    opt.rope = RopeMode::YARN;  // as the fixture was written (plain RoPE within its context)
    Transformer model(mc, f.model.weights, opt);
    model.set_context_width(f.context_width);
    const Tensor& ids = f.expected.tensors.at("input_ids.0");
    const Tensor& want = f.expected.tensors.at("logits.0");
    const int64_t T = ids.size(1), V = want.size(2);
    for (int64_t pages : {int64_t(2), int64_t(64)}) {
        SCOPED_TRACE(str(pages, " pages of 2"));
        KVCacheConfig kc;
        kc.name = "quest-default";
        kc.policy_options = {{"quest_page_size", 2}, {"quest_pages", double(pages)}};
        KVCache cache(kc, mc, Device{}, DType::F32, T);
        for (int64_t l = 0; l < mc.num_layers; ++l)
            EXPECT_EQ(std::string(cache.layer(int(l)).policy().name()), mc.layer_window(l) > 0 ? "window" : "quest") << l;
        std::vector<double> last;
        for (int64_t s = 0; s < T; s += (s == 0 ? 8 : 1)) {
            const int64_t e = s == 0 ? 8 : s + 1;
            last = model.forward(ids.slice(1, s, e).contiguous(), s, &cache).to_f64_vector();
        }
        if (pages < 64) continue;  // a real selection differs from full attention by design
        const int64_t B = ids.size(0);  // the last row's last token
        const Tensor got = Tensor::from_f64({1, 1, V}, std::vector<double>(last.end() - V, last.end()));
        test::Comparison c = test::compare(got, want.slice(0, B - 1, B).slice(1, T - 1, T).contiguous());
        EXPECT_LE(c.rel_err, 1e-5) << c.report;
    }
}

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
