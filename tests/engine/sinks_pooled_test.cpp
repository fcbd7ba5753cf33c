// Attention sinks (gpt-oss) through per-head pools (ada-*): each head group's SDPA over the
// slots it keeps takes its own heads' sink logits. On the gpt_oss_sinks fixture: with room for
// every token the pooled path equals the PyTorch reference's logits; with 8 slots per layer
// every attention call equals a float64 recomputation from the definition (softmax over [the
// group's held scores inside the window, the head's sink]).
#include <gtest/gtest.h>

#include <cmath>

#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "engine/kv/layer_cache.h"
#include "engine/model/transformer.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "tests/engine/gpt_oss_fixture_util.h"

namespace kv {
namespace {
using test::GptOssDriverRun;
using test::gpt_oss_fixture_dir;


// After the cache attends: each head h of group g against the pool slots whose row (b, g)
// position is visible, the head's sink in the denominator, in f64.
class PoolSinkCheck final : public CacheAttention {
   public:
    PoolSinkCheck(KVCache& cache, const Transformer& model) : cache_(cache), model_(model) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y, const ChunkInput& in) override {
        cache_.attend(layer, q, k, v, input_pos, scale, window, y, in);
        LayerCache& lc = cache_.layer(layer);
        const KVPolicy& pol = lc.policy();
        if (window > 0) return;  // the windowed layers are rings (checked in sinks_model_test); the pools are the full layers
        const std::vector<double> sink = model_.layer(layer).sinks.to_f64_vector();
        const int64_t B = q.size(0), NH = q.size(1), n = q.size(2), D = q.size(3), G = k.size(1), R = NH / G;
        const int64_t S = pol.position_row_length();
        auto [K, V] = lc.buffer().read(S);  // (B, 1, S, D): one pool shared by the groups
        EXPECT_EQ(K.size(1), 1);
        const std::vector<double> qv = q.contiguous().to_f64_vector(), yv = y.contiguous().to_f64_vector();
        const std::vector<double> Kv = K.contiguous().to_f64_vector(), Vv = V.contiguous().to_f64_vector();
        const std::vector<int32_t>& pos = pol.token_positions();
        for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < NH; ++h) {
                const int32_t* p = pos.data() + (b * G + h / R) * S;
                for (int64_t i = 0; i < n; ++i) {
                    const int64_t qp = input_pos + i;
                    const double* qi = qv.data() + ((b * NH + h) * n + i) * D;
                    std::vector<double> s(size_t(S), -INFINITY);
                    double m = sink[size_t(h)];
                    for (int64_t t = 0; t < S; ++t) {
                        if (p[t] < 0 || p[t] > qp) continue;
                        const double* kt = Kv.data() + (b * S + t) * D;
                        double dot = 0;
                        for (int64_t d = 0; d < D; ++d) dot += qi[d] * kt[d];
                        s[size_t(t)] = dot * double(scale);
                        m = std::max(m, s[size_t(t)]);
                    }
                    double den = std::exp(sink[size_t(h)] - m);
                    std::vector<double> out(size_t(D), 0.0);
                    for (int64_t t = 0; t < S; ++t) {
                        if (s[size_t(t)] == -INFINITY) continue;
                        const double w = std::exp(s[size_t(t)] - m);
                        den += w;
                        for (int64_t d = 0; d < D; ++d) out[size_t(d)] += w * Vv[size_t((b * S + t) * D + d)];
                    }
                    for (int64_t d = 0; d < D; ++d) {
                        const double want = out[size_t(d)] / den, got = yv[size_t(((b * NH + h) * n + i) * D + d)];
                        max_err = std::max(max_err, std::fabs(got - want));
                        max_ref = std::max(max_ref, std::fabs(want));
                    }
                }
            }
        ++checked;
    }
    int64_t checked = 0;
    double max_err = 0, max_ref = 0;

   private:
    KVCache& cache_;
    const Transformer& model_;
};

TEST(SinksPooled, AdaWithRoomForEveryTokenEqualsPyTorch) {
    const HfModelFolder mf = load_hf_model_folder(gpt_oss_fixture_dir());
    const SafetensorsContents expected = load_safetensors(gpt_oss_fixture_dir() + "/expected.safetensors");
    ModelOptions opt;
    opt.rope = RopeMode::YARN;
    Transformer model(mf.config, mf.weights, opt);
    model.set_context_width(64);
    for (const std::string policy : {"ada-snapkv", "ada-expected-attention"}) {
        SCOPED_TRACE(policy);
        const Tensor& ids = expected.tensors.at("input_ids.1");  // (1, 37)
        const std::vector<double> want = expected.tensors.at("logits.1").to_f64_vector();
        const int64_t T = ids.size(1), V = mf.config.vocab_size;
        KVCacheConfig kc;
        kc.name = policy + "-default";
        kc.cache_length = 64;  // nothing evicted
        KVCache cache(kc, mf.config, Device{}, DType::F32, T);
        std::vector<double> got;
        for (int64_t s = 0; s < T; s += 8) {
            const std::vector<double> z = model.forward(ids.slice(1, s, std::min(T, s + 8)).contiguous(), s, &cache).to_f64_vector();
            got.insert(got.end(), z.begin(), z.end());
        }
        ASSERT_EQ(got.size(), size_t(T * V));
        double err = 0, ref = 0;
        for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(got[i] - want[i])), ref = std::max(ref, std::fabs(want[i]));
        EXPECT_LE(err, 1e-5 * ref);
    }
}

TEST(SinksPooled, AdaSnapkvEvictsWithTheSinkInEveryGroupSoftmax) {
    GptOssDriverRun run("ada-snapkv-default");
    PoolSinkCheck check(*run.cache, *run.model);
    const HeadResult res = run.run(check);
    const int64_t T = run.ids.size(1);
    EXPECT_EQ(check.checked, int64_t(run.plan.chunks.size()) * 2);  // the two full layers
    EXPECT_LE(check.max_err, 1e-5 * check.max_ref) << check.max_err;
    EXPECT_TRUE(std::isfinite(res.loss_sum[0]) && res.count[0] == double(T - 1));
}

}  // namespace
}  // namespace kv
