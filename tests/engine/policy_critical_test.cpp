// critical-* against CriticalKV's definition in f64 (kvpress' CriticalKVPress): the wrapped
// scorer's scores s (here SnapKV's published rule, written in f64 in policy_reference_util.h),
// the floor(first_stage * L) highest kept outright (FLT_MAX), every other slot
// (s + eps) * mean over the KV head's query heads h of ||W_o,h v||_1, with W_o the output
// projection [E, NH D] handed to the cache as the transformer does, or W_o = I without one.
#include <cfloat>
#include <map>

#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "policy_references.h"

namespace kv::test {
namespace {

constexpr int64_t kE = 7;  // hidden size of the made-up output projection (any E works)

std::vector<double> random_wo(int64_t E, int64_t Q) {
    std::mt19937_64 rng(seed_for("critical wo"));
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<double> w((size_t)(E * Q));
    for (double& x : w) x = float(u(rng));  // the values the f32 tensor holds
    return w;
}

TEST(Critical, ScoresAndChoicesEqualTheF64ReferenceWithTheOutputProjection) {
    const LayerHarness shape("critical-snapkv-default", 12, 0);
    const std::vector<double> W = random_wo(kE, shape.NH * shape.D);
    check_policy_against_reference(
        "critical-snapkv-default", [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3; },
        [&W](const LayerHarness& h, int64_t P, int64_t n) {
            return critical_reference(h, published_snapkv_reference(h, P, n, 3, 3), critical_projected_norms(h, W, kE), 0.5, 1e-4);
        },
        {4, 3, 4, 2, 4, 1, 5, 1}, 2e-6, [&W](LayerHarness& h) {
            std::vector<float> wf(W.begin(), W.end());
            h.cache->set_output_projection(0, Tensor::from_f32({kE, h.NH * h.D}, wf));
        });
}

TEST(Critical, WithoutAModelTheNormIsTheValuesL1Norm) {
    check_policy_against_reference(
        "critical-snapkv-default",
        [](KVCacheConfig& c) {
            c.snapkv_window = 2, c.snapkv_kernel = 5;
            c.policy_options["critical_first_stage"] = 0.25;
            c.policy_options["critical_epsilon"] = 0.5;
        },
        [](const LayerHarness& h, int64_t P, int64_t n) {
            return critical_reference(h, published_snapkv_reference(h, P, n, 2, 5), critical_projected_norms(h, {}, 0), 0.25, 0.5);
        });
}

TEST(Critical, FirstStageZeroIsThePlainRescaling) {
    // No stage 1: every slot (s + eps) n_j; the choices follow the rescaled scores alone.
    check_policy_against_reference(
        "critical-snapkv-default",
        [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3, c.policy_options["critical_first_stage"] = 0; },
        [](const LayerHarness& h, int64_t P, int64_t n) {
            return critical_reference(h, published_snapkv_reference(h, P, n, 3, 3), critical_projected_norms(h, {}, 0), 0, 1e-4);
        });
}

TEST(Critical, AMisshapenOutputProjectionIsRefusedByName) {
    LayerHarness h("critical-snapkv-default", 12, seed_for("critical misshapen"));
    h.cache->set_output_projection(0, Tensor::from_f32({kE, 5}, std::vector<float>(size_t(kE * 5), 1.0f)));
    try {
        h.step(12);
        FAIL() << "a W_o of 5 columns for 4 heads of 16 was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("output projection has 5 input columns"), std::string::npos) << e.what();
    }
}


// Forwards to the cache and records which tensor each layer's output projection was.
class ProjectionSpy final : public LayerAttention {
   public:
    explicit ProjectionSpy(KVCache& cache) : cache_(cache) {}
    void set_rope_frequencies(const std::vector<double>* inv_freq) override { cache_.set_rope_frequencies(inv_freq); }
    void set_output_projection(int layer, const Tensor& wo) override {
        seen[layer] = wo.data_ptr();
        cache_.set_output_projection(layer, wo);
    }
    void attend(int layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t input_pos, float scale, int window,
                Tensor& y) override {
        attended[layer] += seen.count(layer) > 0;  // handed before the layer attends
        cache_.attend(layer, q, k, v, input_pos, scale, window, y);
    }
    std::map<int, const void*> seen;
    std::map<int, int> attended;

   private:
    KVCache& cache_;
};

TEST(Critical, TheTransformerHandsEachLayerItsOwnOutputProjection) {
    const ModelConfig cfg = preset_config("tiny");
    const Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
    KVCacheConfig kc;
    kc.name = "critical-snapkv-default";
    kc.cache_length = 8;
    KVCache cache(kc, cfg, Device{}, DType::F32, 16);
    ProjectionSpy spy(cache);
    std::vector<int32_t> ids(16);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i * 7 % cfg.vocab_size);
    const Tensor all = Tensor::from_i32({1, 16}, ids);
    model.forward(all.slice(1, 0, 8).contiguous(), 0, &spy);
    for (int64_t s = 8; s < 16; s += 2) model.forward(all.slice(1, s, s + 2).contiguous(), s, &spy);
    ASSERT_EQ(int64_t(spy.seen.size()), cfg.num_layers);
    for (int l = 0; l < cfg.num_layers; ++l) {
        EXPECT_EQ(spy.seen[l], model.layer(l).wo.data_ptr()) << "layer " << l;
        EXPECT_EQ(spy.attended[l], 5) << "layer " << l;  // the prefill and 4 chunks, each after its W_o
    }
}

}  // namespace
}  // namespace kv::test
