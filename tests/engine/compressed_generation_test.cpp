// Greedy generation from a compressed cache (compress-then-ask's generated answer): every
// generated token is the argmax a teacher-forced pass over prompt + generated tokens gives at the
// position before it (with and without a decoding budget), generation stops at a stop id (not
// included) or max_new tokens, and eval_long reports the answers' mean length and RULER score.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/kv/compressed_cache.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<13>(); }

CompressedCache compressed(const std::vector<int32_t>& ctx, int64_t keep) {
    KVCacheConfig base;
    base.name = "snapkv-default";
    apply_required_options(base);
    const int64_t T = int64_t(ctx.size());
    const KVCacheConfig kc = context_cache_config(base, T);
    RunConfig cfg;
    cfg.driver.chunk_size = 8;
    return compress_context(tiny().model, kc, context_chunk_plan(cfg, kc, tiny().cfg, T), ctx, keep, T + 64, &byte_codec());
}

TEST(CompressedGeneration, EachTokenIsTheTeacherForcedArgmaxAndStopsWhereTold) {
    const std::vector<int32_t> ctx = random_tokens(48, 1), prompt = random_tokens(7, 2);
    for (double ratio : {0.0, 0.5}) {
        SCOPED_TRACE(ratio);
        CompressedCache cc = compressed(ctx, 24);
        cc.set_decode_ratio(ratio);
        const std::vector<int32_t> gen = generate_compressed(tiny().model, cc, prompt, 6, {});
        ASSERT_EQ(gen.size(), 6u) << "no stop id: max_new tokens";
        // Teacher-forced over prompt + generated: the argmax after prompt[-1], gen[0], ... is
        // gen[0], gen[1], ...
        std::vector<int32_t> ids = prompt;
        ids.insert(ids.end(), gen.begin(), gen.end());
        std::vector<int32_t> targets(ids.size(), -100);
        for (size_t t = prompt.size() - 1; t + 1 < ids.size(); ++t) targets[t] = ids[t + 1];
        const AskResult a = ask_compressed(tiny().model, cc, ids, targets);
        EXPECT_EQ(a.argmax, gen);
        // A stop id ends the answer before it: stopping at gen[3] leaves gen[0..3) (when gen[3]
        // does not occur earlier).
        if (std::find(gen.begin(), gen.begin() + 3, gen[3]) == gen.begin() + 3) {
            const std::vector<int32_t> cut = generate_compressed(tiny().model, cc, prompt, 6, {gen[3]});
            EXPECT_EQ(cut, std::vector<int32_t>(gen.begin(), gen.begin() + 3));
        }
        EXPECT_EQ(generate_compressed(tiny().model, cc, prompt, 2, {}), std::vector<int32_t>(gen.begin(), gen.begin() + 2));
    }
}

TEST(CompressedGeneration, EvalReportsTheGreedyAnswersLengthAndScore) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "niah_single";
    cfg.data.seq_length = 600;
    cfg.data.num_samples = 2;
    cfg.driver.chunk_size = 64;
    cfg.kv_cache.name = "snapkv-default";
    cfg.protocol.name = "compress-then-ask";
    cfg.protocol.compression_ratio = 0.5;
    const EvalSummary sum = run_eval(cfg, lm);
    ASSERT_EQ(sum.samples.size(), 2u);
    double len = 0, score = 0;
    for (const EvalSampleResult& r : sum.samples) {
        EXPECT_GE(r.generated_tokens, 0);
        EXPECT_GE(r.generated_score, 0.0);
        EXPECT_LE(r.generated_score, 1.0);
        len += double(r.generated_tokens) / 2.0;
        score += r.generated_score / 2.0;
    }
    EXPECT_DOUBLE_EQ(sum.generated_tokens, len);
    EXPECT_DOUBLE_EQ(sum.generated_score, score);
}

}  // namespace
}  // namespace kv::test
