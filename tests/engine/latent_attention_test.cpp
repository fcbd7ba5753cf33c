// Multi-head latent attention (DeepSeek-V2) in the model: the config reader against
// DeepseekV2Config's fields and refusals, and eval_long's driver with h2o and snapkv on the
// deepseek_v2_mla fixture, every attention call checked against a float64 recomputation of the
// cache's attention over the keys it holds, with values of v_head_dim and zero padding.
// (Logits against the PyTorch reference, whole and chunked: ModelFixture/deepseek_v2_*mla and
// ModelFixtureLayers.ChunkedThroughDenseCacheMatchesReference.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/fixture_driver_util.h"

namespace kv {
namespace {
using test::drive_next_token;
using test::fixture_chunk_plan;

std::string fixture_dir(const std::string& name) { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name; }

std::string read_text(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

TEST(DeepseekV2Config, LatentSizesFollowTransformers) {
    const ModelConfig c = parse_model_config(read_text(fixture_dir("deepseek_v2_mla") + "/config.json"), "config.json");
    EXPECT_EQ(c.arch, Arch::DEEPSEEK_V2);
    ASSERT_TRUE(c.latent_attention());
    EXPECT_EQ(c.latent.q_lora_rank, 16);
    EXPECT_EQ(c.latent.kv_lora_rank, 12);
    EXPECT_EQ(c.latent.v_head_dim, 6);
    // config.json's head_dim is qk_rope_head_dim (8); kvlab's key head is nope + rope = 16, of
    // which the first 8 channels rotate.
    EXPECT_EQ(c.head_dim, 16);
    EXPECT_EQ(c.rope_dims(), 8);
    EXPECT_EQ(c.num_kv_heads, c.num_heads);
    EXPECT_EQ(c.v_head_dim(), 6);
    EXPECT_DOUBLE_EQ(c.query_scale(), 1.0 / 4.0);  // (qk_nope + qk_rope)^-1/2
    const ModelConfig lite = parse_model_config(read_text(fixture_dir("deepseek_v2_lite_mla") + "/config.json"), "config.json");
    EXPECT_EQ(lite.latent.q_lora_rank, 0);  // null: q_proj
    EXPECT_EQ(lite.head_dim, 8);
    EXPECT_EQ(lite.v_head_dim(), 8);
}

std::string refusal(const std::string& extra) {
    const std::string json = R"({"model_type": "deepseek_v2", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64, "kv_lora_rank": 12,
        "q_lora_rank": null, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 6)" + extra + "}";
    try {
        parse_model_config(json, "config.json");
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(DeepseekV2Config, RefusesWhatItDoesNotRunByName) {
    EXPECT_EQ(refusal(R"(, "first_k_dense_replace": 2)"), "");
    std::string m = refusal(R"(, "first_k_dense_replace": 1)");
    EXPECT_NE(m.find("first_k_dense_replace"), std::string::npos) << m;
    EXPECT_NE(m.find("mixture-of-experts MLP is not supported"), std::string::npos) << m;
    m = refusal(R"(, "first_k_dense_replace": 2, "rope_scaling": {"type": "yarn", "factor": 4.0,
                   "original_max_position_embeddings": 16, "mscale": 0.707, "mscale_all_dim": 0.707})");
    EXPECT_NE(m.find("rope_scaling"), std::string::npos) << m;
    EXPECT_NE(m.find("mscale"), std::string::npos) << m;
    m = refusal(R"(, "first_k_dense_replace": 2, "attention_bias": true)");
    EXPECT_NE(m.find("attention_bias"), std::string::npos) << m;
    m = refusal(R"(, "first_k_dense_replace": 2, "v_head_dim": 24)");
    EXPECT_NE(m.find("v_head_dim"), std::string::npos) << m;
    m = refusal(R"(, "first_k_dense_replace": 2, "num_key_value_heads": 2)");
    EXPECT_NE(m.find("num_key_value_heads"), std::string::npos) << m;
}

TEST(DeepseekV2Model, KeepsWhatTheReversePassNeeds) {
    const HfModelFolder mf = load_hf_model_folder(fixture_dir("deepseek_v2_mla"));
    ModelOptions expanded;  // the reverse pass runs the expanded form (a latent cache keeps no activations)
    expanded.mla_cache = LatentAttention::Cache::EXPANDED;
    Transformer model(mf.config, mf.weights, expanded);
    model.set_context_width(64);
    PlainAttention plain;
    BlockActivations save;
    const Tensor x = Tensor::full({1, 3, mf.config.hidden_size}, DType::F32, 0.5);
    const Tensor out = model.block(0, x, 0, plain, &save);
    const LatentAttention& la = mf.config.latent;
    EXPECT_FALSE(save.qkv.defined());
    EXPECT_EQ(save.q_a.shape(), (Shape{1, 3, la.q_lora_rank}));
    EXPECT_EQ(save.q_in.shape(), (Shape{1, 3, la.q_lora_rank}));
    EXPECT_EQ(save.ckv.shape(), (Shape{1, 3, la.kv_lora_rank + la.qk_rope_head_dim}));
    EXPECT_EQ(save.c.shape(), (Shape{1, 3, la.kv_lora_rank}));
    // keeping them does not change the block
    PlainAttention plain2;
    EXPECT_EQ(out.to_f32_vector(), model.block(0, x, 0, plain2).to_f32_vector());
    // parameters as the checkpoint counts them (o_proj without kvlab's padding)
    int64_t n = 0;
    for (const auto& [name, t] : mf.weights) n += t.numel();
    EXPECT_EQ(model.parameter_count(), n);
}

TEST(DeepseekV2Model, LatentFormRefusesTheReversePassByName) {
    const HfModelFolder mf = load_hf_model_folder(fixture_dir("deepseek_v2_mla"));
    Transformer model(mf.config, mf.weights, ModelOptions{});
    ASSERT_TRUE(model.config().latent_cache());  // the default form
    model.set_context_width(64);
    // Through a cache that stores latents (a forward without one runs the expanded form:
    // LatentCache.ForwardWithoutACacheRunsTheExpandedForm).
    KVCache cache(KVCacheConfig{}, model.config(), Device{}, DType::F32, 3);
    BlockActivations save;
    const Tensor x = Tensor::full({1, 3, mf.config.hidden_size}, DType::F32, 0.5);
    std::string msg;
    try {
        model.block(0, x, 0, cache, &save);
    } catch (const Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("reverse pass through multi-head latent attention runs the expanded form"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected --model.mla_cache expanded"), std::string::npos) << msg;
}

// Against transformers' own DeepSeek-V2 modules (tools/reference/deepseek_v2_check.py ran the
// classes of transformers 4.57's modeling_deepseek_v2.py in float64, eager attention, and
// wrote transformers.safetensors): the whole sequence, and chunks of 32 through a dense cache.
TEST(DeepseekV2Fixture, MatchesTransformersDeepseekV2Code) {
    for (const std::string name : {"deepseek_v2_mla", "deepseek_v2_lite_mla"}) {
        const HfModelFolder mf = load_hf_model_folder(fixture_dir(name));
        const SafetensorsContents expected = load_safetensors(fixture_dir(name) + "/expected.safetensors");
        const SafetensorsContents tf = load_safetensors(fixture_dir(name) + "/transformers.safetensors");
        ModelOptions opt;
        opt.rope = RopeMode::YARN;
        Transformer model(mf.config, mf.weights, opt);
        model.set_context_width(64);
        for (int j = 0; expected.tensors.count("input_ids." + std::to_string(j)); ++j) {
            SCOPED_TRACE(str(name, " input ", j));
            const Tensor& ids = expected.tensors.at("input_ids." + std::to_string(j));
            const std::vector<double> want = tf.tensors.at("logits." + std::to_string(j)).to_f64_vector();
            const int64_t B = ids.size(0), T = ids.size(1), V = mf.config.vocab_size;
            const std::vector<double> whole = model.forward(ids).to_f64_vector();
            KVCacheConfig kc;
            KVCache cache(kc, mf.config, Device{}, DType::F32, T);
            std::vector<double> chunked(size_t(B * T * V));
            for (int64_t s = 0; s < T; s += 32) {
                const int64_t e = std::min(T, s + 32);
                const std::vector<double> z = model.forward(ids.slice(1, s, e).contiguous(), s, &cache).to_f64_vector();
                for (int64_t b = 0; b < B; ++b)
                    for (int64_t t = s; t < e; ++t)
                        for (int64_t v = 0; v < V; ++v) chunked[size_t((b * T + t) * V + v)] = z[size_t((b * (e - s) + (t - s)) * V + v)];
            }
            double ref = 0, e1 = 0, e2 = 0;
            for (size_t i = 0; i < want.size(); ++i) {
                ref = std::max(ref, std::fabs(want[i]));
                e1 = std::max(e1, std::fabs(whole[i] - want[i]));
                e2 = std::max(e2, std::fabs(chunked[i] - want[i]));
            }
            EXPECT_LE(e1, 1e-5 * ref);
            EXPECT_LE(e2, 1e-5 * ref);
        }
    }
}

// Observes every attention call: after the cache attends, recomputes each query's attention in
// f64 over the slots the cache holds, and records the largest difference from the cache's
// output, and whether the values' padding channels stayed zero in the cache and the output.
class LatentCheck final : public CacheAttention {
   public:
    LatentCheck(KVCache& cache, int64_t v_head_dim) : cache_(cache), vd_(v_head_dim) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y, const ChunkInput& in) override {
        cache_.attend(layer, q, k, v, input_pos, scale, window, y, in);
        LayerCache& lc = cache_.layer(layer);
        const KVPolicy& pol = lc.policy();
        const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = k.size(1), R = NH / G;
        const int64_t T = pol.current_length(), L = pol.cache_length();
        auto [K, V] = lc.buffer().read(T);
        const std::vector<double> qv = q.contiguous().to_f64_vector(), yv = y.contiguous().to_f64_vector();
        const std::vector<double> Kv = K.contiguous().to_f64_vector(), Vv = V.contiguous().to_f64_vector();
        for (size_t i = 0; i < Vv.size(); ++i)
            if (int64_t(i) % D >= vd_ && Vv[i] != 0.0) ++nonzero_padding;
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
                        if (p[t] < 0 || p[t] > qp || (window > 0 && p[t] <= qp - window)) continue;
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
                        if (d >= vd_ && got != 0.0) ++nonzero_padding;
                        max_err = std::max(max_err, std::fabs(got - want));
                        max_ref = std::max(max_ref, std::fabs(want));
                    }
                }
            }
        ++calls;
    }
    int64_t calls = 0, nonzero_padding = 0;
    double max_err = 0, max_ref = 0;

   private:
    KVCache& cache_;
    int64_t vd_;
};

// eval_long's driver over the fixture's 37 tokens (a prefill of 6, chunks of 2, then single
// tokens) with an evicting policy holding 8 slots per layer.
// Expanded: the per-head keys, values of v_head_dim padded with zeros. Latent: one KV head of
// [k_pe ; c_kv] per token, the values the keys (no padding: the check's value width is the head).
void run_evicting(const std::string& cache_name, LatentAttention::Cache form = LatentAttention::Cache::EXPANDED) {
    SCOPED_TRACE(cache_name);
    const HfModelFolder mf = load_hf_model_folder(fixture_dir("deepseek_v2_mla"));
    const SafetensorsContents expected = load_safetensors(fixture_dir("deepseek_v2_mla") + "/expected.safetensors");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    opt.mla_cache = form;
    Transformer model(mf.config, mf.weights, opt);
    const ModelConfig& mc = model.config();
    model.set_context_width(64);
    const Tensor& ids = expected.tensors.at("input_ids.1");  // (1, 37)
    const int64_t T = ids.size(1);
    KVCacheConfig kc;
    kc.name = cache_name;
    kc.cache_length = 8;
    KVCache cache(kc, mc, Device{}, DType::F32, T);
    LatentCheck check(cache, mc.latent_cache() ? mc.cache_head_dim() : mc.v_head_dim());
    const ChunkPlan plan = fixture_chunk_plan(T);  // a prefill of 6 tokens, then chunks of 2 and single tokens
    const HeadResult res = drive_next_token(model, cache, ids, plan, check);
    EXPECT_EQ(check.calls, int64_t(plan.chunks.size()) * mf.config.num_layers);
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << "max |y - f64 attention over the held keys| " << check.max_err;
    EXPECT_EQ(check.nonzero_padding, 0);
    EXPECT_TRUE(std::isfinite(res.loss_sum[0]) && res.count[0] == double(T - 1));
    for (int64_t l = 0; l < mf.config.num_layers; ++l) {
        EXPECT_EQ(cache.layer(int(l)).policy().cache_length(), 8);
        EXPECT_EQ(cache.layer(int(l)).policy().current_length(), 8);  // it evicted: 37 tokens, 8 slots
        EXPECT_EQ(cache.layer(int(l)).policy().groups(), mc.cache_kv_heads());
    }
    // The next tokens' losses are the expanded form's (the same kept slots would give the same
    // attention; here only finiteness and the count are the driver's business).
}

TEST(DeepseekV2Fixture, H2oAndSnapkvEvictDecompressedKeys) {
    run_evicting("h2o-default");
    run_evicting("snapkv-default");
}
// The latent cache: h2o and snapkv score one latent slot per token for all heads (one group, the
// weight sums over every query head), every call against f64 attention over the held latents.
// (quest reads a selection: cli.tiny_mla_quest.)
TEST(DeepseekV2Fixture, H2oAndSnapkvEvictLatents) {
    run_evicting("h2o-default", LatentAttention::Cache::LATENT);
    run_evicting("snapkv-default", LatentAttention::Cache::LATENT);
}

// The preset runs without a checkpoint: its whole-sequence logits equal the same tokens fed
// through a dense cache one chunk of 32 at a time.
TEST(DeepseekV2Preset, TinyMlaChunkedEqualsOnePass) {
    const ModelConfig c = preset_config("tiny-mla");
    ASSERT_TRUE(c.latent_attention());
    Transformer model(c, random_weights(c, 7, DType::F32, Device{}), ModelOptions{});
    model.set_context_width(128);
    std::vector<int32_t> tok(100);
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 37 + 11) % 256);
    const Tensor ids = Tensor::from_i32({1, 100}, tok);
    const std::vector<double> whole = model.forward(ids).to_f64_vector();
    KVCacheConfig kc;
    KVCache cache(kc, c, Device{}, DType::F32, 100);
    std::vector<double> chunked;
    for (int64_t s = 0; s < 100; s += 32) {
        const std::vector<double> z = model.forward(ids.slice(1, s, std::min<int64_t>(100, s + 32)).contiguous(), s, &cache).to_f64_vector();
        chunked.insert(chunked.end(), z.begin(), z.end());
    }
    ASSERT_EQ(chunked.size(), whole.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < whole.size(); ++i) err = std::max(err, std::fabs(chunked[i] - whole[i])), ref = std::max(ref, std::fabs(whole[i]));
    EXPECT_LE(err, 1e-5 * ref);
}

}  // namespace
}  // namespace kv
