// With layers of different cache lengths (pyramidkv), the chunk plan stretches a chunk that ends
// just short of a layer's length onto it (keys_values' CLOSEBY rule), up to kChunkSnapTokens past
// the chunk size. eval_long must run such a plan: before, the top-k size defaulted to the bare
// chunk size and every full layer refused the stretched chunk (SmolLM2, 8192 tokens, pyramidkv at
// cache 1024 with chunks of 64 or 128 failed this way).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/data/repeat_task.h"
#include "engine/driver/chunk_plan.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"

namespace kv::test {
namespace {

// One repeat-task sample of 256 tokens on tiny, pyramidkv at cache 96: layer lengths {184, 8}.
RunConfig pyramid_repeat_config() {
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "repeat";
    cfg.data.seq_length = 256;
    cfg.data.num_samples = 1;
    cfg.data.repeat_length = 24;
    cfg.data.repeat_distance = 100;
    cfg.kv_cache.name = "pyramidkv-default";
    cfg.kv_cache.cache_length = 96;
    cfg.kv_cache.snapkv_window = 4;
    return cfg;
}

TEST(ChunkSnapEval, PyramidLayersRunAChunkStretchedOntoALayerLength) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    const int64_t nl = lm.config.num_layers;
    RunConfig cfg = pyramid_repeat_config();
    RepeatSpec spec;
    spec.seq_length = 256;
    spec.passage_length = 24;
    spec.distance = 100;
    spec.seed = cfg.data.seed;
    const int64_t T = int64_t(make_repeat_sample(spec, 0, *lm.tokenizer).ids.size());  // the sequence the driver plans
    std::vector<int64_t> Ls;
    for (int64_t l = 0; l < nl; ++l) Ls.push_back(cfg.kv_cache.length_for_layer(l, T, nl));
    ASSERT_GE(Ls.size(), 2u);
    ASSERT_NE(Ls.front(), Ls.back()) << "pyramidkv gives the layers different lengths";
    const int64_t shortest = *std::min_element(Ls.begin(), Ls.end());
    // The case: a chunk size (at most the shortest layer) whose plan stretches some chunk past
    // it (found, not assumed).
    int64_t chunk = 0;
    for (int64_t c = 2; c <= shortest && chunk == 0; ++c) {
        ChunkPlanOptions o;
        o.chunk_size = c;
        if (plan_chunks(T, Ls, o).max_chunk() > c) chunk = c;
    }
    ASSERT_GT(chunk, 0) << "no chunk size up to " << shortest << " makes the plan stretch a chunk for lengths "
                        << ::testing::PrintToString(Ls);
    cfg.driver.chunk_size = chunk;
    EvalSummary s;
    ASSERT_NO_THROW(s = run_eval(cfg, lm)) << "chunk size " << chunk << ", layer lengths " << ::testing::PrintToString(Ls);
    EXPECT_TRUE(std::isfinite(s.mean_loss));
    EXPECT_GT(s.mean_loss, 0.0);
}

// A chunk size above the shortest layer's length: chunks are cut to that length (a full layer
// of it could not take more), and the run goes through.
TEST(ChunkSnapEval, ChunksLongerThanTheShortestLayerAreCutToIt) {
    const std::vector<int64_t> Ls = {184, 8};
    ChunkPlanOptions o;
    o.chunk_size = 25;
    const ChunkPlan p = plan_chunks(256, Ls, o);
    int64_t sum = 0;
    for (size_t i = 0; i < p.chunks.size(); ++i) {
        sum += p.chunks[i];
        EXPECT_LE(p.chunks[i], 8) << "chunk " << i;
    }
    EXPECT_EQ(sum, 256);
    EXPECT_EQ(p.chunks.front(), 8) << "the prefill fills the shortest cache";

    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg = pyramid_repeat_config();
    cfg.driver.chunk_size = 25;
    EvalSummary s;
    ASSERT_NO_THROW(s = run_eval(cfg, lm));
    EXPECT_TRUE(std::isfinite(s.mean_loss));
}

}  // namespace
}  // namespace kv::test
