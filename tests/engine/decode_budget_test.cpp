// The decoding-time budget of compress-then-ask (--kv_cache.decode_ratio r): after each decoded
// token every layer holds exactly floor((1 - r) seen) slots per row (the counts worked by hand
// below), the decoded tokens all among them and the context slots left the policy's
// highest-scoring ones; a ratio that evicts nothing answers as the batched question does; a
// position-only policy, a budget below the decoded tokens and mixed budgets are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"
#include "engine/run/protocol.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<9>(); }

CompressedCache compressed(const std::string& name, const std::vector<int32_t>& ctx, int64_t keep, int64_t width) {
    KVCacheConfig base;
    base.name = name;
    apply_required_options(base);
    const int64_t T = int64_t(ctx.size());
    const KVCacheConfig kc = context_cache_config(base, T);
    RunConfig cfg;
    cfg.driver.chunk_size = 8;
    return compress_context(tiny().model, kc, context_chunk_plan(cfg, kc, tiny().cfg, T), ctx, keep, width, &byte_codec());
}

// One decoded token through every layer (what ask_compressed does per token under a budget).
void decode_one(CompressedCache& cc, int32_t id, int64_t pos) {
    Tensor x = tiny().model.embed(Tensor::from_i32({1, 1}, {id}));
    for (int l = 0; l < cc.num_layers(); ++l) x = tiny().model.block(l, x, pos, cc);
}

TEST(DecodeBudget, HoldsFloorOfOneMinusRatioOfSeenAfterEveryToken) {
    const int64_t T = 40;
    const double r = 0.75;
    const std::vector<int32_t> ctx = random_tokens(T, 1), q = random_tokens(12, 2);
    // floor(0.25 * seen), seen = 40 + s for s = 1..12: 10.25, 10.5, 10.75, 11, ..., 13.
    const std::vector<int64_t> expect = {10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 13};
    for (const char* name : {"h2o-default", "snapkv-default", "knorm-default"}) {
        SCOPED_TRACE(name);
        CompressedCache cc = compressed(name, ctx, 10, T + 16);  // floor(0.25 * 40) at compression
        cc.set_decode_ratio(r);
        cc.rewind();
        for (size_t s = 0; s < q.size(); ++s) {
            decode_one(cc, q[s], T + int64_t(s));
            const int64_t held = int64_t(s) + 1;
            for (int l = 0; l < cc.num_layers(); ++l) {
                ASSERT_EQ(cc.slots(l), expect[s]) << "layer " << l << " after " << held << " tokens";
                ASSERT_EQ(cc.context_slots(l), expect[s] - held);
                // Each row: the decoded tokens, and the context slots of the highest compression
                // scores (ties: the later kept), read from the compressed layer itself.
                const CompressedLayer& c = cc.layer(l);
                const int64_t kept = cc.kept(l), rows = int64_t(c.positions.size()) / kept, k = expect[s] - held;
                bool shared = true;
                for (int64_t row = 1; row < rows; ++row)
                    shared &= std::equal(c.positions.begin(), c.positions.begin() + kept, c.positions.begin() + row * kept);
                for (int64_t row = 0; row < rows; ++row) {
                    std::vector<std::pair<double, int32_t>> ranked;  // (score, position)
                    for (int64_t i = 0; i < kept; ++i) {
                        double v = 0;
                        for (int64_t o = shared ? 0 : row; o < (shared ? rows : row + 1); ++o) v += double(c.scores[size_t(o * kept + i)]);
                        ranked.push_back({v, c.positions[size_t(row * kept + i)]});
                    }
                    std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
                        return a.first > b.first || (a.first == b.first && a.second > b.second);
                    });
                    std::vector<int32_t> want;
                    for (int64_t i = 0; i < k; ++i) want.push_back(ranked[size_t(i)].second);
                    std::sort(want.begin(), want.end());
                    for (int64_t t = 0; t < held; ++t) want.push_back(int32_t(T + t));
                    const std::vector<int32_t>& now = cc.positions_now(l);
                    const int64_t w = cc.slots(l);
                    EXPECT_EQ(std::vector<int32_t>(now.begin() + row * w, now.begin() + (row + 1) * w), want) << "layer " << l << " row " << row;
                }
            }
        }
        // Token 13: floor(0.25 * 53) = 13 slots hold the 13 decoded tokens; token 14 would need
        // to evict one of them (floor(0.25 * 54) = 13 < 14): refused, naming the option.
        decode_one(cc, q[0], T + 12);
        EXPECT_EQ(cc.slots(0), 13);
        EXPECT_EQ(cc.context_slots(0), 0);
        try {
            decode_one(cc, q[1], T + 13);
            FAIL() << "the budget fell below the decoded tokens";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("--kv_cache.decode_ratio"), std::string::npos) << e.what();
        }
        // rewind() brings back every context slot.
        cc.rewind();
        for (int l = 0; l < cc.num_layers(); ++l) EXPECT_EQ(cc.slots(l), 10);
    }
}

// A ratio that evicts nothing over the question: the token-by-token pass answers as the batched
// one (the same attention, up to the order of float sums).
TEST(DecodeBudget, NothingEvictedAnswersAsTheBatchedQuestion) {
    const int64_t T = 40;
    const std::vector<int32_t> ctx = random_tokens(T, 3), q = random_tokens(10, 4);
    std::vector<int32_t> tg(q.begin() + 1, q.end());
    tg.push_back(-100);
    // r = 0.01: 39 kept; floor(0.99 (40 + s)) >= 39 + s for s <= 60, so no eviction.
    CompressedCache cc = compressed("h2o-default", ctx, 39, T + 16);
    const AskResult batched = ask_compressed(tiny().model, cc, q, tg, true);
    cc.set_decode_ratio(0.01);
    const AskResult stepped = ask_compressed(tiny().model, cc, q, tg, true);
    for (int l = 0; l < cc.num_layers(); ++l) EXPECT_EQ(cc.slots(l), 39 + 10);
    ASSERT_EQ(batched.logits.size(), stepped.logits.size());
    double worst = 0;
    for (size_t i = 0; i < batched.logits.size(); ++i) worst = std::max(worst, std::abs(double(batched.logits[i]) - double(stepped.logits[i])));
    EXPECT_LT(worst, 1e-4);
    EXPECT_EQ(batched.argmax, stepped.argmax);
}

TEST(DecodeBudget, RefusesPositionOnlyPoliciesAndMixedBudgets) {
    const std::vector<int32_t> ctx = random_tokens(24, 5);
    CompressedCache cc = compressed("lastrec-default", ctx, 12, 40);
    try {
        cc.set_decode_ratio(0.5);
        FAIL() << "lastrec keeps no scores";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.decode_ratio"), std::string::npos) << e.what();
    }
    auto first = [](const RunConfig& c) {
        const auto p = run_config_problems(c);
        return p.empty() ? std::string() : p.front();
    };
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "h2o-default";
    c.protocol.name = "compress-then-ask";
    set_run_option(c, "kv_cache.decode_ratio", "0.5");
    EXPECT_EQ(first(c), "");
    EXPECT_EQ(compress_keep(c.protocol, 101), 50) << "the compression takes the decode ratio: floor(0.5 * 101)";
    RunConfig other = c;
    other.protocol.compression_ratio = 0.25;
    EXPECT_NE(first(other).find("decode_ratio"), std::string::npos) << first(other);
    other.protocol.compression_ratio = 0.5;
    EXPECT_EQ(first(other), "");
    RunConfig chunked = c;
    chunked.protocol.name = "chunked";
    chunked.kv_cache.cache_length = 64;
    EXPECT_NE(first(chunked).find("decode_ratio"), std::string::npos) << first(chunked);
    EXPECT_EQ(run_config_from_json(run_config_to_json(c), "test").protocol.decode_ratio, 0.5);
}

// eval_long end to end: after the question and answer the layers hold floor((1 - r) seen).
TEST(DecodeBudget, EvalRecordsTheSlotsAfterDecoding) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "niah_single";
    cfg.data.seq_length = 600;
    cfg.data.num_samples = 1;
    cfg.driver.chunk_size = 64;
    cfg.kv_cache.name = "snapkv-default";
    cfg.protocol.name = "compress-then-ask";
    cfg.protocol.decode_ratio = 0.5;
    RulerSpec spec;
    spec.task = cfg.data.name;
    spec.seq_length = cfg.data.seq_length;
    spec.seed = cfg.data.seed;
    const RulerSample s = make_ruler_sample(spec, 0, *lm.tokenizer);
    const EvalSummary sum = run_eval(cfg, lm);
    const int64_t decoded = int64_t(s.ids.size()) - s.question_start;
    EXPECT_EQ(sum.decoded_tokens, decoded);
    ASSERT_EQ(int64_t(sum.decode_final_slots.size()), lm.config.num_layers);
    for (int64_t k : sum.decode_final_slots) EXPECT_EQ(k, int64_t(s.ids.size()) / 2) << "floor(0.5 * seen), seen = the whole sample";
    for (int64_t k : sum.kept_slots) EXPECT_EQ(k, s.question_start / 2);
}

}  // namespace
}  // namespace kv::test
