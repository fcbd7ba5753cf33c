// The threshold budget of compress-then-ask (--kv_cache.score_threshold): each (b, g) row keeps
// exactly the context slots whose policy score is >= t (checked against the policy's own scores,
// filtered here), shorter rows end in unused slots that attention never reads (changing their
// K/V changes no logit, and a save and load keeps them), a threshold below every score keeps what
// keeping all T keeps, one above every score keeps none; position-only policies and mixed
// budgets are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/protocol.h"
#include "tests/engine/context_run_util.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<5>(); }

std::vector<int32_t> next_targets(const std::vector<int32_t>& q) {
    std::vector<int32_t> t(q.begin() + 1, q.end());
    t.push_back(-100);
    return t;
}

TEST(ScoreThreshold, EachRowKeepsExactlyTheSlotsScoringAtLeastT) {
    const int64_t T = 48;
    const std::vector<int32_t> ctx = random_tokens(T, 31);
    for (const char* name : {"h2o-default", "snapkv-default", "knorm-default"}) {
        SCOPED_TRACE(name);
        ContextRun run = run_context(name, ctx);
        // t = the median of layer 0's scores: some rows keep more than others.
        std::vector<float> s0 = run.cache->layer(0).policy().slot_scores();
        ASSERT_FALSE(s0.empty());
        std::nth_element(s0.begin(), s0.begin() + s0.size() / 2, s0.end());
        const double t = double(s0[s0.size() / 2]);
        CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, t);
        bool uneven = false;
        size_t logical = 0, physical = 0;
        for (int l = 0; l < cc.num_layers(); ++l) {
            const KVPolicy& p = run.cache->layer(l).policy();
            const std::vector<float> s = p.slot_scores();
            const int64_t L = p.cache_length(), rows = p.batch() * p.groups(), width = cc.kept(l);
            const CompressedLayer& c = cc.layer(l);
            int64_t total = 0;
            for (int64_t r = 0; r < rows; ++r) {
                // The reference: this row's slots (slot j = position j) with score >= t, or the
                // mean over rows for a policy that keeps one set per layer.
                std::vector<int32_t> expect;
                for (int64_t j = 0; j < T; ++j) {
                    double v = 0;
                    if (p.per_row_positions()) v = s[size_t(r * L + j)];
                    else {
                        for (int64_t q = 0; q < rows; ++q) v += s[size_t(q * L + j)];
                        v /= double(rows);
                    }
                    if (v >= t) expect.push_back(int32_t(j));
                }
                std::vector<int32_t> got;
                for (int64_t i = 0; i < width; ++i) {
                    const int32_t pos = c.positions[size_t(r * width + i)];
                    if (pos == kUnusedSlotPosition) {
                        // Unused slots only at the end of a row.
                        for (int64_t k = i; k < width; ++k) EXPECT_EQ(c.positions[size_t(r * width + k)], kUnusedSlotPosition);
                        break;
                    }
                    got.push_back(pos);
                }
                EXPECT_EQ(got, expect) << "layer " << l << " row " << r;
                total += int64_t(expect.size());
                uneven |= int64_t(expect.size()) != width;
            }
            EXPECT_EQ(cc.kept_total(l), total) << "layer " << l;
            logical += size_t(total * c.K.size(3)) * 2 * sizeof(float);
            physical += size_t(rows * width * c.K.size(3)) * 2 * sizeof(float);
        }
        // Bytes: the kept tokens (logical) and the rows padded to the longest (physical).
        EXPECT_EQ(cc.logical_bytes(), logical);
        EXPECT_EQ(cc.kept_bytes(), physical);
        if (std::string(name) != "h2o-default") {
            EXPECT_LT(cc.logical_bytes(), cc.kept_bytes());
        }
        // h2o's scores fall with the slot in both heads alike (earlier tokens are attended by
        // more queries), so its rows may keep equal counts; the others' do not.
        if (std::string(name) != "h2o-default") {
            EXPECT_TRUE(uneven) << "the test should exercise rows of different lengths";
        }
    }
}

// Unused slots are masked: replacing their K/V with anything changes no logit, bit for bit.
TEST(ScoreThreshold, UnusedSlotsAreNeverAttended) {
    const int64_t T = 40;
    const std::vector<int32_t> ctx = random_tokens(T, 41), q = random_tokens(10, 42);
    ContextRun run = run_context("knorm-default", ctx);  // its heads keep different counts
    std::vector<float> s0 = run.cache->layer(0).policy().slot_scores();
    std::sort(s0.begin(), s0.end());
    CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, double(s0[s0.size() / 3]));
    std::vector<CompressedLayer> layers;
    int64_t unused = 0;
    std::mt19937_64 rng(5);
    for (int l = 0; l < cc.num_layers(); ++l) {
        CompressedLayer c = cc.layer(l);
        std::vector<float> K = c.K.to_f32_vector(), V = c.V.to_f32_vector();
        const int64_t width = c.K.size(2), D = c.K.size(3);
        for (size_t i = 0; i < c.positions.size(); ++i)
            if (c.positions[i] == kUnusedSlotPosition) {
                ++unused;
                for (int64_t d = 0; d < D; ++d) K[i * size_t(D) + size_t(d)] = V[i * size_t(D) + size_t(d)] = float(rng() % 1000) - 500.0f;
            }
        c.K = Tensor::from_f32({c.K.size(0), c.K.size(1), width, D}, K, DType::F32);
        c.V = Tensor::from_f32({c.V.size(0), c.V.size(1), width, D}, V, DType::F32);
        layers.push_back(std::move(c));
    }
    ASSERT_GT(unused, 0);
    CompressedCache changed(cc.cache_name(), cc.context_length(), cc.rope_width(), std::move(layers));
    const AskResult a = ask_compressed(tiny().model, cc, q, next_targets(q), true);
    const AskResult b = ask_compressed(tiny().model, changed, q, next_targets(q), true);
    EXPECT_EQ(a.logits, b.logits);
    // The unused slots survive a save and load (the file format marks them the same way).
    const std::string path = ::testing::TempDir() + "score_threshold.kvcc";
    save_compressed_cache(cc, ctx, path);
    CompressedCache loaded = load_compressed_cache(path, Device{}, &ctx);
    for (int l = 0; l < cc.num_layers(); ++l) EXPECT_EQ(loaded.layer(l).positions, cc.layer(l).positions);
    EXPECT_EQ(ask_compressed(tiny().model, loaded, q, next_targets(q), true).logits, a.logits);
    std::remove(path.c_str());
}

TEST(ScoreThreshold, BelowEveryScoreKeepsAllAboveKeepsNone) {
    const int64_t T = 32;
    const std::vector<int32_t> ctx = random_tokens(T, 51), q = random_tokens(6, 52);
    ContextRun run = run_context("h2o-default", ctx);
    CompressedCache all = compress_cache_threshold(*run.cache, run.kc, -1e30);
    CompressedCache full = compress_cache(*run.cache, run.kc, T);
    for (int l = 0; l < all.num_layers(); ++l) {
        EXPECT_EQ(all.kept(l), T);
        EXPECT_EQ(all.layer(l).positions, full.layer(l).positions);
    }
    EXPECT_EQ(ask_compressed(tiny().model, all, q, next_targets(q), true).logits,
              ask_compressed(tiny().model, full, q, next_targets(q), true).logits);
    CompressedCache none = compress_cache_threshold(*run.cache, run.kc, 1e30);
    for (int l = 0; l < none.num_layers(); ++l) EXPECT_EQ(none.kept_total(l), 0);
    // The question still sees itself: the same logits as a context of nothing kept in any layer
    // is not something else to compare with, so check the answer is finite.
    const AskResult a = ask_compressed(tiny().model, none, q, next_targets(q), true);
    for (float z : a.logits) ASSERT_TRUE(std::isfinite(z));
}

TEST(ScoreThreshold, RefusesPositionOnlyPoliciesAndMixedBudgets) {
    const std::vector<int32_t> ctx = random_tokens(24, 61);
    ContextRun run = run_context("lastrec-default", ctx);
    try {
        compress_cache_threshold(*run.cache, run.kc, 0.5);
        FAIL() << "lastrec has no scores";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.score_threshold"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("lastrec"), std::string::npos) << e.what();
    }
    auto first = [](const RunConfig& c) {
        const auto p = run_config_problems(c);
        return p.empty() ? std::string() : p.front();
    };
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "h2o-default";
    c.protocol.name = "compress-then-ask";
    set_run_option(c, "kv_cache.score_threshold", "0.25");
    EXPECT_EQ(first(c), "");
    EXPECT_EQ(*score_threshold(c.protocol), 0.25);
    RunConfig mixed = c;
    mixed.protocol.compression_ratio = 0.5;
    EXPECT_NE(first(mixed).find("score_threshold"), std::string::npos) << first(mixed);
    RunConfig bad = c;
    bad.protocol.score_threshold = "half";
    EXPECT_NE(first(bad).find("'half' is not a number"), std::string::npos) << first(bad);
    RunConfig chunked = c;
    chunked.protocol.name = "chunked";
    chunked.kv_cache.cache_length = 64;
    EXPECT_NE(first(chunked).find("score_threshold"), std::string::npos) << first(chunked);
    EXPECT_EQ(run_config_from_json(run_config_to_json(c), "test").protocol.score_threshold, "0.25");
}

}  // namespace
}  // namespace kv::test
