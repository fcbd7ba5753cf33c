// DMS-style threshold eviction in compress-then-ask (--kv_cache.score_threshold t with
// --kv_cache.threshold_window w, kvpress's DMSPress): each (b, g) row keeps exactly the context
// slots scoring >= t plus the last w positions, whatever their score. The reference is worked out
// here in f64 from the definition: for knorm the score is -||k|| of the cached key (kvpress's
// KnormPress), recomputed from the cache's K; for attention scorers the rule is applied to the
// policy's own scores. The per-row counts the run reports (kept_rows) equal the reference's,
// the questions appended after the compressed context are never evicted (and with DMS's decoding
// the window's low scorers go as they leave it), a window covering the
// context keeps it all, and a bad window is refused with one message naming the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/protocol.h"
#include "tests/engine/context_run_util.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<5>(); }

// (rows, T) knorm's score from its definition, -||k_j||_2 in f64, over the cached keys of layer l
// (slot j holds position j: the context pass evicts nothing).
std::vector<double> knorm_reference(KVCache& cache, int l, int64_t T) {
    LayerCache& lc = cache.layer(l);
    lc.buffer().flush();
    auto [K, V] = lc.buffer().read(T);
    const std::vector<float> k = K.to_f32_vector();
    const int64_t rows = K.size(0) * K.size(1), D = K.size(3);
    std::vector<double> s((size_t)(rows * T));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < T; ++j) {
            double n2 = 0;
            for (int64_t d = 0; d < D; ++d) {
                const double x = k[size_t((r * T + j) * D + d)];
                n2 += x * x;
            }
            s[size_t(r * T + j)] = -std::sqrt(n2);
        }
    return s;
}

// A threshold halfway between the two reference scores around the median, so no score sits
// within rounding of it (the policy stores f32).
double threshold_between(std::vector<double> s) {
    std::sort(s.begin(), s.end());
    size_t i = s.size() / 2;
    while (i + 1 < s.size() && s[i + 1] - s[i] < 1e-4) ++i;
    return 0.5 * (s[i] + s[i + 1]);
}

// The kept positions of row r of a compressed layer, unused slots (only at a row's end) dropped.
std::vector<int32_t> kept_positions(const CompressedLayer& c, int64_t r) {
    const int64_t width = c.K.size(2);
    std::vector<int32_t> got;
    for (int64_t i = 0; i < width; ++i) {
        const int32_t p = c.positions[size_t(r * width + i)];
        if (p == kUnusedSlotPosition) {
            for (int64_t k = i; k < width; ++k) EXPECT_EQ(c.positions[size_t(r * width + k)], kUnusedSlotPosition);
            break;
        }
        got.push_back(p);
    }
    return got;
}

TEST(DmsThreshold, KnormKeepsEveryKeyAtLeastTAndTheRecentWindowPerHead) {
    const int64_t T = 48, w = 8;
    const std::vector<int32_t> ctx = random_tokens(T, 71);
    ContextRun run = run_context("knorm-default", ctx);
    const double t = threshold_between(knorm_reference(*run.cache, 0, T));
    CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, t, 0, w);
    int64_t rescued = 0;  // recent positions kept only by the window
    bool uneven = false;
    for (int l = 0; l < cc.num_layers(); ++l) {
        const std::vector<double> s = knorm_reference(*run.cache, l, T);
        const int64_t rows = int64_t(s.size()) / T;
        const std::vector<int64_t> counts = cc.kept_rows(l);
        ASSERT_EQ(int64_t(counts.size()), rows);
        int64_t total = 0;
        for (int64_t r = 0; r < rows; ++r) {
            std::vector<int32_t> expect;
            for (int64_t j = 0; j < T; ++j) {
                const bool scored = s[size_t(r * T + j)] >= t, recent = j >= T - w;
                if (scored || recent) expect.push_back(int32_t(j));
                rescued += recent && !scored ? 1 : 0;
            }
            EXPECT_EQ(kept_positions(cc.layer(l), r), expect) << "layer " << l << " row " << r;
            EXPECT_EQ(counts[size_t(r)], int64_t(expect.size())) << "layer " << l << " row " << r;
            uneven |= counts[size_t(r)] != counts[0];
            total += int64_t(expect.size());
        }
        EXPECT_EQ(cc.kept_total(l), total) << "layer " << l;
    }
    EXPECT_GT(rescued, 0) << "the test should exercise the window keeping low-scoring recent slots";
    EXPECT_TRUE(uneven) << "the test should exercise heads keeping different counts";
}

TEST(DmsThreshold, AttentionScorersKeepTheirScoresAtLeastTAndTheWindow) {
    const int64_t T = 40, w = 6;
    const std::vector<int32_t> ctx = random_tokens(T, 81);
    for (const char* name : {"snapkv-default", "h2o-default", "tova-default"}) {
        SCOPED_TRACE(name);
        ContextRun run = run_context(name, ctx);
        std::vector<double> s0;
        for (float x : run.cache->layer(0).policy().slot_scores()) s0.push_back(double(x));
        ASSERT_FALSE(s0.empty());
        const double t = threshold_between(s0);
        CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, t, 0, w);
        for (int l = 0; l < cc.num_layers(); ++l) {
            const KVPolicy& p = run.cache->layer(l).policy();
            const std::vector<float> s = p.slot_scores();
            const int64_t L = p.cache_length(), rows = p.batch() * p.groups();
            for (int64_t r = 0; r < rows; ++r) {
                std::vector<int32_t> expect;
                for (int64_t j = 0; j < T; ++j) {
                    double v = 0;  // per row, or the mean over rows for one set per layer
                    if (p.per_row_positions()) v = double(s[size_t(r * L + j)]);
                    else {
                        for (int64_t q = 0; q < rows; ++q) v += double(s[size_t(q * L + j)]);
                        v /= double(rows);
                    }
                    if (v >= t || j >= T - w) expect.push_back(int32_t(j));
                }
                EXPECT_EQ(kept_positions(cc.layer(l), r), expect) << "layer " << l << " row " << r;
                EXPECT_EQ(cc.kept_rows(l)[size_t(r)], int64_t(expect.size()));
            }
        }
    }
}

// The question goes after the compressed context and stays: every question position is held by
// every row of every layer after it is asked, next to the kept context.
TEST(DmsThreshold, QuestionsAreNeverEvicted) {
    const int64_t T = 32, n = 9, w = 4;
    const std::vector<int32_t> ctx = random_tokens(T, 91), q = random_tokens(n, 92);
    ContextRun run = run_context("knorm-default", ctx);
    CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, 1e30, 0, w);  // only the window survives
    std::vector<int32_t> targets(q.begin() + 1, q.end());
    targets.push_back(-100);
    ask_compressed(tiny().model, cc, q, targets, false);
    for (int l = 0; l < cc.num_layers(); ++l) {
        EXPECT_EQ(cc.kept_total(l), int64_t(cc.kept_rows(l).size()) * w);
        const std::vector<int32_t>& pos = cc.positions_now(l);
        const int64_t rows = int64_t(cc.kept_rows(l).size()), width = int64_t(pos.size()) / rows;
        for (int64_t r = 0; r < rows; ++r) {
            std::vector<int32_t> row(pos.begin() + r * width, pos.begin() + (r + 1) * width), expect;
            for (int64_t j = T - w; j < T + n; ++j) expect.push_back(int32_t(j));
            EXPECT_EQ(row, expect) << "layer " << l << " row " << r;
        }
    }
}

TEST(DmsThreshold, AWindowOverTheWholeContextKeepsAll) {
    const int64_t T = 24;
    const std::vector<int32_t> ctx = random_tokens(T, 101);
    ContextRun run = run_context("snapkv-default", ctx);
    CompressedCache all = compress_cache_threshold(*run.cache, run.kc, 1e30, 0, T + 5);
    CompressedCache full = compress_cache(*run.cache, run.kc, T);
    for (int l = 0; l < all.num_layers(); ++l) EXPECT_EQ(all.layer(l).positions, full.layer(l).positions) << "layer " << l;
}

TEST(DmsThreshold, ABadWindowIsRefusedNamingTheOption) {
    const std::vector<int32_t> ctx = random_tokens(16, 111);
    ContextRun run = run_context("knorm-default", ctx);
    try {
        compress_cache_threshold(*run.cache, run.kc, 0.0, 0, -1);
        FAIL() << "a negative window";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.threshold_window: -1; expected 0 or more"), std::string::npos) << e.what();
    }
    auto first = [](const RunConfig& c) {
        const auto p = run_config_problems(c);
        return p.empty() ? std::string() : p.front();
    };
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "knorm-default";
    c.protocol.name = "compress-then-ask";
    set_run_option(c, "kv_cache.score_threshold", "-2.5");
    set_run_option(c, "kv_cache.threshold_window", "128");
    EXPECT_EQ(first(c), "");
    EXPECT_EQ(run_config_from_json(run_config_to_json(c), "test").protocol.threshold_window, 128);
    try {
        set_run_option(c, "kv_cache.threshold_window", "-3");
        FAIL() << "a negative window option";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.threshold_window: -3 is out of range"), std::string::npos) << e.what();
    }
    RunConfig alone = c;
    alone.protocol.score_threshold.clear();
    EXPECT_NE(first(alone).find("--kv_cache.threshold_window: 128 protects the recent context from a score threshold; expected "
                                "--kv_cache.score_threshold with it"),
              std::string::npos)
        << first(alone);
    RunConfig chunked = alone;
    chunked.protocol.name = "chunked";
    chunked.kv_cache.cache_length = 64;
    EXPECT_NE(first(chunked).find("threshold_window"), std::string::npos) << first(chunked);
}

// DMS's decoding: fed one token per forward, each context slot that leaves the last w positions
// seen and scores below t goes. After a question of n tokens the context keeps exactly the slots
// scoring >= t (knorm's -||k|| in f64) plus those still among the last w of the T + n seen (n = 5:
// some of the window left, some not; n = 12: all of it left), every question token stays, and
// the layer's rows are padded to the longest again.
TEST(DmsThreshold, DecodingEvictsTheWindowsLowScorersAsTheyLeaveIt) {
    const int64_t T = 40, w = 8;
    const std::vector<int32_t> ctx = random_tokens(T, 121);
    ContextRun run = run_context("knorm-default", ctx);
    const double t = threshold_between(knorm_reference(*run.cache, 0, T));
    CompressedCache cc = compress_cache_threshold(*run.cache, run.kc, t, 0, w);
    cc.set_decode_threshold(t, w);
    ASSERT_TRUE(cc.decodes_per_token());
    for (const int64_t n : {5, 12}) {
        SCOPED_TRACE(n);
        const std::vector<int32_t> q = random_tokens(n, 122);
        std::vector<int32_t> targets(q.begin() + 1, q.end());
        targets.push_back(-100);
        ask_compressed(tiny().model, cc, q, targets, false);
        int64_t dropped = 0, protected_low = 0;
        for (int l = 0; l < cc.num_layers(); ++l) {
            const std::vector<double> s = knorm_reference(*run.cache, l, T);
            const int64_t rows = int64_t(s.size()) / T;
            const std::vector<int32_t>& pos = cc.positions_now(l);
            const int64_t width = int64_t(pos.size()) / rows, ctx_slots = cc.context_slots(l);
            ASSERT_EQ(width, ctx_slots + n);
            int64_t longest = 0;
            for (int64_t r = 0; r < rows; ++r) {
                std::vector<int32_t> expect, got;
                for (int64_t j = 0; j < T; ++j) {
                    const bool scored = s[size_t(r * T + j)] >= t, recent = j >= T + n - w;
                    if (scored || recent) expect.push_back(int32_t(j));
                    dropped += j >= T - w && !recent && !scored ? 1 : 0;
                    protected_low += recent && !scored ? 1 : 0;
                }
                longest = std::max(longest, int64_t(expect.size()));
                for (int64_t i = 0; i < ctx_slots; ++i) {
                    const int32_t p = pos[size_t(r * width + i)];
                    if (p == kUnusedSlotPosition) {
                        for (int64_t k = i; k < ctx_slots; ++k) EXPECT_EQ(pos[size_t(r * width + k)], kUnusedSlotPosition);
                        break;
                    }
                    got.push_back(p);
                }
                EXPECT_EQ(got, expect) << "layer " << l << " row " << r;
                for (int64_t i = 0; i < n; ++i)
                    EXPECT_EQ(pos[size_t(r * width + ctx_slots + i)], int32_t(T + i)) << "layer " << l << " row " << r;
            }
            EXPECT_EQ(ctx_slots, longest) << "layer " << l;
        }
        EXPECT_GT(dropped, 0) << "the test should exercise slots the window kept at compression and decoding evicted";
        if (n < w) {
            EXPECT_GT(protected_low, 0) << "the test should exercise low-scoring slots still inside the window";
        }
    }
    // rewind() brings the compression's context back (each question starts from it).
    cc.rewind();
    for (int l = 0; l < cc.num_layers(); ++l) EXPECT_EQ(cc.positions_now(l), cc.layer(l).positions);
    // Two budgets at once, or no scores, are refused by name.
    CompressedCache both = compress_cache_threshold(*run.cache, run.kc, t, 0, w);
    both.set_decode_threshold(t, w);
    try {
        both.set_decode_ratio(0.5);
        FAIL() << "a ratio with a decoding threshold";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.decode_ratio: a decoding ratio and --kv_cache.threshold_decode"), std::string::npos)
            << e.what();
    }
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "knorm-default";
    c.protocol.name = "compress-then-ask";
    set_run_option(c, "kv_cache.threshold_decode", "true");
    const std::vector<std::string> p = run_config_problems(c);
    ASSERT_FALSE(p.empty());
    EXPECT_NE(p.front().find("--kv_cache.threshold_decode: evicts below a score threshold while decoding; expected --kv_cache.score_threshold"),
              std::string::npos)
        << p.front();
}

}  // namespace
}  // namespace kv::test
