// gpt-oss attention (learned sinks, alternating sliding / full layers) in the model: the
// config reader against GptOssConfig's rules, and eval_long's driver with h2o on the
// gpt_oss_sinks fixture, every attention call checked against a float64 recomputation from the
// definition (softmax over [held scores inside the window, the layer's sink]).
// (Logits against the PyTorch reference, whole and chunked: ModelFixture/gpt_oss_sinks and
// ModelFixtureLayers.ChunkedThroughDenseCacheMatchesReference.)
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_config.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/gpt_oss_fixture_util.h"

namespace kv {
namespace {
using test::GptOssDriverRun;
using test::gpt_oss_fixture_dir;
using test::gpt_oss_moe_fixture_dir;


std::string read_text(const std::string& path) {
    std::ifstream f(path);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
}

TEST(GptOssConfig, LayerTypesSinksAndBiasesFollowTransformers) {
    const ModelConfig c = parse_model_config(read_text(gpt_oss_fixture_dir() + "/config.json"), "config.json");
    EXPECT_EQ(c.arch, Arch::GPT_OSS);
    EXPECT_TRUE(c.attention_sinks);
    EXPECT_TRUE(c.qkv_bias && c.o_bias);
    for (int64_t l = 0; l < 4; ++l) EXPECT_EQ(c.layer_window(l), l % 2 == 0 ? 5 : 0) << l;
    // Without layer_types: GptOssConfig's default alternation, sliding first, window 128.
    const ModelConfig d = parse_model_config(
        R"({"model_type": "gpt_oss", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
            "num_local_experts": 0})",
        "config.json");
    for (int64_t l = 0; l < 3; ++l) EXPECT_EQ(d.layer_window(l), l % 2 == 0 ? 128 : 0) << l;
}

// num_local_experts > 0 makes every layer's MLP GptOssMLP's experts, with GptOssConfig's
// defaults (num_experts_per_tok 4, swiglu_limit 7, swiglu_alpha 1.702); 0 keeps kvlab's dense form.
TEST(GptOssConfig, ReadsTheMixtureOfExperts) {
    const std::string head = R"({"model_type": "gpt_oss", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                               "max_position_embeddings": 64, )";
    const ModelConfig c = parse_model_config(head + R"("num_local_experts": 32})", "config.json");
    EXPECT_EQ(c.moe.num_experts, 32);
    EXPECT_EQ(c.moe.top_k, 4);
    EXPECT_EQ(c.moe.limit, 7.0);
    EXPECT_EQ(c.moe.alpha, 1.702);
    for (int64_t l = 0; l < 2; ++l) EXPECT_TRUE(c.experts_layer(l)) << l;
    const ModelConfig d = parse_model_config(
        head + R"("num_local_experts": 8, "num_experts_per_tok": 3, "swiglu_limit": 5.5, "swiglu_alpha": 1.5})", "config.json");
    EXPECT_EQ(d.moe.num_experts, 8);
    EXPECT_EQ(d.moe.top_k, 3);
    EXPECT_EQ(d.moe.limit, 5.5);
    EXPECT_EQ(d.moe.alpha, 1.5);
    const ModelConfig dense = parse_model_config(head + R"("num_local_experts": 0})", "config.json");
    EXPECT_FALSE(dense.has_experts());
    try {
        parse_model_config(head + R"("num_local_experts": 4, "num_experts_per_tok": 5})", "config.json");
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("num_experts_per_tok must be in [1, num_local_experts = 4], got 5"), std::string::npos) << m;
    }
}

// The released checkpoints keep the experts in MXFP4 blocks: refused by name, from the config
// and from the tensors alike.
TEST(GptOssConfig, RefusesMxfp4ExpertsByName) {
    try {
        parse_model_config(R"({"model_type": "gpt_oss", "vocab_size": 97, "hidden_size": 32, "intermediate_size": 48,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                               "max_position_embeddings": 64, "num_local_experts": 32,
                               "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": []}})",
                           "config.json");
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("quantization_config"), std::string::npos) << m;
        EXPECT_NE(m.find("has quant_method mxfp4; kvlab reads gpt-oss's experts as float tensors only"), std::string::npos) << m;
    }
    const HfModelFolder mf = load_hf_model_folder(gpt_oss_moe_fixture_dir());
    TensorMap w = mf.weights;
    const std::string p = "model.layers.1.mlp.experts.";
    w[p + "gate_up_proj_blocks"] = Tensor::zeros({1}, DType::U8);
    w.erase(p + "gate_up_proj");
    try {
        Transformer m(mf.config, w, ModelOptions{});
        FAIL() << "expected a refusal";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("'model.layers.1.mlp.experts.gate_up_proj' is stored as MXFP4 blocks"), std::string::npos) << m;
    }
}

// Observes every attention call: after the cache attends, recomputes each query's attention in
// f64 over the slots the cache holds inside the layer's window, with the layer's sink logit in
// the denominator, and records the largest difference from the cache's output.
class SinkCheck final : public CacheAttention {
   public:
    SinkCheck(KVCache& cache, const Transformer& model) : cache_(cache), model_(model) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y, const ChunkInput& in) override {
        cache_.attend(layer, q, k, v, input_pos, scale, window, y, in);
        EXPECT_EQ(window, model_.config().layer_window(layer));
        const std::vector<double> sink = model_.layer(layer).sinks.to_f64_vector();
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
                    double m = sink[size_t(h)];
                    for (int64_t t = 0; t < T; ++t) {
                        if (p[t] < 0 || p[t] > qp || (window > 0 && p[t] <= qp - window)) continue;
                        const double* kt = Kv.data() + ((b * G + g) * T + t) * D;
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kt[d];
                        s[size_t(t)] = dot * double(scale);
                        m = std::max(m, s[size_t(t)]);
                    }
                    double den = std::exp(sink[size_t(h)] - m), mass = 0;
                    std::vector<double> out(size_t(D), 0.0);
                    for (int64_t t = 0; t < T; ++t) {
                        if (s[size_t(t)] == -INFINITY) continue;
                        const double w = std::exp(s[size_t(t)] - m);
                        den += w, mass += w;
                        for (int64_t d = 0; d < D; ++d) out[size_t(d)] += w * Vv[size_t(((b * G + g) * T + t) * D + d)];
                    }
                    min_kept_mass = std::min(min_kept_mass, mass / den);
                    max_kept_mass = std::max(max_kept_mass, mass / den);
                    for (int64_t d = 0; d < D; ++d) {
                        const double want = out[size_t(d)] / den, got = yv[size_t(((b * NH + h) * n + i) * D + d)];
                        max_err = std::max(max_err, std::fabs(got - want));
                        max_ref = std::max(max_ref, std::fabs(want));
                    }
                }
            }
        ++calls;
    }
    int64_t calls = 0;
    double max_err = 0, max_ref = 0;
    double min_kept_mass = 1, max_kept_mass = 0;  // share of each row's softmax on the keys (the sink has the rest)

   private:
    KVCache& cache_;
    const Transformer& model_;
};

// eval_long's driver with h2o (8 slots on the full layers 1 and 3, rings on 0 and 2) over the
// fixture's 37 tokens: a prefill, chunks of 2, then single tokens.
TEST(GptOssFixture, H2oRunsWithTheSinkInEverySoftmax) {
    GptOssDriverRun run("h2o-default");
    SinkCheck check(*run.cache, *run.model);
    const HeadResult res = run.run(check);
    const int64_t T = run.ids.size(1);
    EXPECT_EQ(check.calls, int64_t(run.plan.chunks.size()) * run.mf.config.num_layers);
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << "max |y - f64 sink attention over the held keys| " << check.max_err;
    // The sink really takes mass (the fixture's sinks are of the scores' size), never all of it.
    EXPECT_LT(check.min_kept_mass, 0.9);
    EXPECT_GT(check.max_kept_mass, 0.1);
    EXPECT_TRUE(std::isfinite(res.loss_sum[0]) && res.count[0] == double(T - 1));
    EXPECT_EQ(run.cache->layer(1).policy().cache_length(), 8);  // h2o on the full layers
}

}  // namespace
}  // namespace kv
