// A non-finite activation stops a long-context run where it first appeared (issue 17): before,
// a NaN weight gave "mean loss nan" on a run marked done. The check is per chunk and per layer,
// so the error names the layer; a clean model passes it untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/driver/long_context.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"

namespace kv::test {
namespace {

struct Inputs {
    Tensor ids;
    ChunkPlan plan;
    HeadSpec head;
};

Inputs setup(const ModelConfig& cfg, int64_t T) {
    Inputs s;
    std::mt19937_64 rng(5);
    std::vector<int32_t> v((size_t)T);
    for (auto& x : v) x = int32_t(rng() % 256);
    s.ids = Tensor::from_i32({1, T}, v);
    ChunkPlanOptions po;
    po.chunk_size = 16;
    po.cell_factor = cell_factor(cfg);
    s.plan = plan_chunks(T, std::vector<int64_t>(size_t(cfg.num_layers), T), po);
    s.head.kind = HeadKind::NEXT_TOKEN;
    s.head.T = T;
    s.head.token_targets.assign(size_t(T), -100);
    for (int64_t p = 0; p + 1 < T; ++p) s.head.token_targets[size_t(p)] = v[size_t(p + 1)];
    return s;
}

TEST(NonFiniteStop, ANanWeightStopsTheRunNamingTheLayer) {
    const ModelConfig cfg = preset_config("tiny");
    ASSERT_GE(cfg.num_layers, 2);
    const int64_t T = 64;
    Inputs s = setup(cfg, T);
    {
        // Clean weights: the check passes and the loss is finite.
        Transformer model{cfg, random_weights(cfg, 3, DType::F32), ModelOptions{}};
        KVCache cache(KVCacheConfig{}, cfg, Device{}, DType::F32, T);
        HeadResult res;
        long_context_forward(model, cache, s.ids, s.plan, s.head, res);
        EXPECT_TRUE(std::isfinite(res.loss_sum[0]));
    }
    for (float bad : {NAN, INFINITY}) {
        TensorMap w = random_weights(cfg, 3, DType::F32);
        const std::string name = "model.layers.1.mlp.down_proj.weight";
        ASSERT_TRUE(w.count(name)) << name;
        w.at(name).data<float>()[7] = bad;
        Transformer model{cfg, w, ModelOptions{}};
        KVCache cache(KVCacheConfig{}, cfg, Device{}, DType::F32, T);
        HeadResult res;
        try {
            long_context_forward(model, cache, s.ids, s.plan, s.head, res);
            ADD_FAILURE() << "a non-finite weight (" << bad << ") ran to the end";
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("non-finite value (nan or inf) first appeared in the output of layer 1 (transformer block) "
                               "in chunk 0"),
                      std::string::npos)
                << msg;
            EXPECT_NE(msg.find("the run stopped"), std::string::npos) << msg;
        }
    }
}

}  // namespace
}  // namespace kv::test
