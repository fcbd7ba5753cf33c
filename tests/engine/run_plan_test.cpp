// The one chunk planner of evaluation and training (engine/run/run_plan.h): chunk sizes from the
// reference's rule (the first chunk fills the cache, then chunk_size), a dense reference that
// steps through the sequence like the runs it is compared with, and the max-chunk widening with
// layers of different lengths (training's copy once lacked it).
#include <gtest/gtest.h>

#include <vector>

#include "engine/core/error.h"
#include "engine/model/presets.h"
#include "engine/run/run_plan.h"

namespace kv::test {
namespace {

RunConfig eval_config(const std::string& cache, int64_t L, int64_t prefill) {
    RunConfig c;
    c.mode = "eval_long";
    c.model = "tiny";
    c.data.seq_length = 512;
    c.kv_cache.name = cache;
    c.kv_cache.cache_length = L;
    c.driver.chunk_size = 32;
    c.driver.prefill_length = prefill;
    return c;
}

std::vector<int64_t> chunks_of(const RunConfig& c) {
    const ModelConfig mc = preset_config("tiny");
    const KVCacheConfig kc = run_cache_config(c, mc, DType::F32);
    return run_chunk_plan(c, kc, mc, c.data.seq_length, 0).chunks;
}

TEST(RunPlan, ADenseReferenceGivenThePolicysCacheLengthStepsAsThePolicyDoes) {
    // By the rule: 128 tokens fill the cache, then (512 - 128) / 32 = 12 chunks of 32.
    std::vector<int64_t> want{128};
    want.insert(want.end(), 12, 32);
    EXPECT_EQ(chunks_of(eval_config("h2o-default", 128, 0)), want);
    EXPECT_EQ(chunks_of(eval_config("dense-default", 0, 128)), want) << "the compared runs' chunks";
    EXPECT_EQ(chunks_of(eval_config("dense-default", 0, 0)), std::vector<int64_t>{512}) << "alone, dense is one prefill";
    // A prefill below the cache length: that many tokens first, then chunks, the cache length
    // still a chunk boundary.
    std::vector<int64_t> short_prefill{64, 32, 32};
    short_prefill.insert(short_prefill.end(), 12, 32);
    EXPECT_EQ(chunks_of(eval_config("h2o-default", 128, 64)), short_prefill);
    EXPECT_FALSE(run_config_problems(eval_config("h2o-default", 128, 256)).empty()) << "a prefill beyond the cache is refused";
    EXPECT_TRUE(run_config_problems(eval_config("dense-default", 0, 128)).empty());
}

TEST(RunPlan, LayersOfDifferentLengthsWidenTheTopKForTrainingAndEvaluationAlike) {
    RunConfig c = eval_config("h2o-default", 128, 0);
    const ModelConfig mc = preset_config("tiny");
    EXPECT_EQ(run_cache_config(c, mc, DType::F32).max_chunk_size, 32);
    c.kv_cache.layer_cache_lengths = {128, 96};
    c.kv_cache.layer_cache_lengths.resize(size_t(mc.num_layers), 96);
    EXPECT_EQ(run_cache_config(c, mc, DType::F32).max_chunk_size, 32 + kChunkSnapTokens);
    c.mode = "finetune_lora";
    EXPECT_EQ(run_cache_config(c, mc, DType::F32).max_chunk_size, 32 + kChunkSnapTokens) << "training plans as evaluation";
}

}  // namespace
}  // namespace kv::test
