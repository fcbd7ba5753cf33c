// Re-scoring while decoding (--kv_cache.decode_rescore_every N, CompressedCache::set_decode_rescore):
// the budget still holds floor((1 - r) seen) slots after every decoded token (counts worked by
// hand); with N = 1 the context slots kept after step t are the highest by the compression's
// score plus the attention every decoded query so far paid the slot, that attention recomputed
// here in f64 from the queries and keys the layers handed the cache (softmax over the slots
// held, averaged over the heads of a group); with N = 3 the attention joins the scores only at
// steps 3, 6, ...; N without a decoding budget, or below 0, is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "engine/core/error.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/transformer.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/protocol.h"
#include "engine/run/run_config.h"
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

// Passes every call to the cache after writing down what the layer handed it.
struct Spy final : LayerAttention {
    CompressedCache& cc;
    std::vector<float> q, k;  // of the last call
    int64_t NH = 0, G = 0, D = 0;
    float scale = 0;
    int window = 0;
    std::vector<int32_t> ctx_before;  // positions_now of the layer before the call
    std::vector<float> ctx_scores_before;
    int64_t ctx_slots_before = 0;
    std::function<void(int)> after;
    explicit Spy(CompressedCache& c) : cc(c) {}
    void attend(int layer, const Tensor& q_, const Tensor& k_, const Tensor& v, int64_t input_pos, float s, int w, Tensor& y) override {
        q = q_.to_f32_vector(), k = k_.to_f32_vector();
        NH = q_.size(1), G = k_.size(1), D = k_.size(3), scale = s, window = w;
        ctx_before = cc.positions_now(layer);
        ctx_scores_before = cc.context_scores(layer);
        ctx_slots_before = cc.context_slots(layer);
        cc.attend(layer, q_, k_, v, input_pos, s, w, y);
        if (after) after(layer);
    }
};

TEST(DecodeRescore, BudgetHoldsAndEveryStepRanksByCompressionScorePlusDecodedAttention) {
    const int64_t T = 40;
    const double r = 0.75;
    const std::vector<int32_t> ctx = random_tokens(T, 11), q = random_tokens(12, 12);
    // floor(0.25 * seen), seen = 40 + s for s = 1..12.
    const std::vector<int64_t> expect = {10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 13};
    for (const char* name : {"h2o-default", "snapkv-default", "knorm-default"})
        for (int64_t every : {1, 3}) {
            SCOPED_TRACE(std::string(name) + " every " + std::to_string(every));
            CompressedCache cc = compressed(name, ctx, 10, T + 16);
            cc.set_decode_ratio(r);
            cc.set_decode_rescore(every);
            cc.rewind();
            const int L = cc.num_layers();
            // Per layer: the appended keys so far (rows, t, D) and, per row and context position,
            // the attention decoded queries paid it since the last re-score and the score now.
            std::vector<std::vector<std::vector<double>>> app_keys(static_cast<size_t>(L));  // [l][row] flattened (t, D)
            std::vector<std::vector<std::map<int32_t, double>>> pending(static_cast<size_t>(L)), score(static_cast<size_t>(L));
            for (int l = 0; l < L; ++l) {
                const CompressedLayer& c = cc.layer(l);
                const int64_t rows = int64_t(c.positions.size()) / cc.kept(l);
                app_keys[size_t(l)].assign(size_t(rows), {});
                pending[size_t(l)].assign(size_t(rows), {});
                score[size_t(l)].assign(size_t(rows), {});
                for (int64_t row = 0; row < rows; ++row)
                    for (int64_t i = 0; i < cc.kept(l); ++i)
                        score[size_t(l)][size_t(row)][c.positions[size_t(row * cc.kept(l) + i)]] = double(c.scores[size_t(row * cc.kept(l) + i)]);
            }
            Spy spy(cc);
            int64_t step = 0;
            int changed = 0;     // steps where the kept set differs from the compression's order alone
            int near_ties = 0, checks = 0;  // kept sets decided by a near-tie, of all checked
            spy.after = [&](int l) {
                ASSERT_EQ(spy.window, 0);
                const CompressedLayer& c = cc.layer(l);
                const int64_t kept0 = cc.kept(l), rows = int64_t(c.positions.size()) / kept0, D = spy.D, hpg = spy.NH / spy.G;
                const int64_t ctx_n = spy.ctx_slots_before, held = step + 1;
                const int64_t before_w = int64_t(spy.ctx_before.size()) / rows;
                // f64 attention of this token's query heads over the slots held: the context slots
                // left (their keys from the compressed layer), the earlier decoded keys, its own.
                const std::vector<float> K0 = c.K.to_f32_vector();
                for (int64_t row = 0; row < rows; ++row) {
                    const int64_t g = row % spy.G;
                    std::vector<std::vector<double>> keys;
                    std::vector<int32_t> kpos;
                    for (int64_t j = 0; j < ctx_n; ++j) {
                        const int32_t p = spy.ctx_before[size_t(row * before_w + j)];
                        int64_t i = 0;
                        while (c.positions[size_t(row * kept0 + i)] != p) ++i;
                        keys.emplace_back(K0.begin() + (row * kept0 + i) * D, K0.begin() + (row * kept0 + i + 1) * D);
                        kpos.push_back(p);
                    }
                    auto& ak = app_keys[size_t(l)][size_t(row)];
                    ak.insert(ak.end(), spy.k.begin() + row * D, spy.k.begin() + (row + 1) * D);
                    for (int64_t t = 0; t < held; ++t) keys.emplace_back(ak.begin() + t * D, ak.begin() + (t + 1) * D), kpos.push_back(-1);
                    std::vector<double> w(keys.size(), 0.0);
                    const int64_t b = row / spy.G;
                    for (int64_t h = g * hpg; h < (g + 1) * hpg; ++h) {
                        const float* qh = spy.q.data() + (b * spy.NH + h) * D;
                        std::vector<double> s(keys.size());
                        double mx = -1e300, z = 0;
                        for (size_t j = 0; j < keys.size(); ++j) {
                            double d = 0;
                            for (int64_t e = 0; e < D; ++e) d += double(qh[e]) * keys[j][size_t(e)];
                            s[j] = double(spy.scale) * d, mx = std::max(mx, s[j]);
                        }
                        for (double& x : s) z += (x = std::exp(x - mx));
                        for (size_t j = 0; j < keys.size(); ++j) w[j] += s[j] / z / double(hpg);
                    }
                    for (int64_t j = 0; j < ctx_n; ++j) pending[size_t(l)][size_t(row)][kpos[size_t(j)]] += w[size_t(j)];
                    // What the cache held as scores before this step matches the reference's.
                    for (int64_t j = 0; j < ctx_n; ++j)
                        ASSERT_NEAR(spy.ctx_scores_before[size_t(row * ctx_n + j)], score[size_t(l)][size_t(row)][kpos[size_t(j)]],
                                    1e-4 * (1 + std::abs(score[size_t(l)][size_t(row)][kpos[size_t(j)]])));
                }
                if (held % every == 0)
                    for (int64_t row = 0; row < rows; ++row)
                        for (auto& [p, a] : pending[size_t(l)][size_t(row)]) score[size_t(l)][size_t(row)][p] += a, a = 0;
                // Expected: the budget's count, the decoded tokens, and the context slots held
                // before this step ranked by the reference scores (summed over rows when the rows
                // share positions; ties: the later stays).
                ASSERT_EQ(cc.slots(l), expect[size_t(step)]) << "layer " << l << " after " << held << " tokens";
                const int64_t keepc = expect[size_t(step)] - held;
                ASSERT_EQ(cc.context_slots(l), keepc);
                // Rows rank together when the compression kept one set for all of them (not when
                // per-row evictions happen to leave the same positions).
                bool shared = true;
                for (int64_t row = 1; row < rows; ++row)
                    shared &= std::equal(c.positions.begin(), c.positions.begin() + kept0, c.positions.begin() + row * kept0);
                for (int64_t row = 0; row < rows; ++row) {
                    std::vector<std::pair<double, int32_t>> ranked, by_compression;
                    for (int64_t j = 0; j < ctx_n; ++j) {
                        const int32_t p = spy.ctx_before[size_t(row * before_w + j)];
                        double v = 0, v0 = 0;
                        for (int64_t o = shared ? 0 : row; o < (shared ? rows : row + 1); ++o) {
                            v += score[size_t(l)][size_t(o)][p];
                            int64_t i = 0;
                            while (c.positions[size_t(o * kept0 + i)] != p) ++i;
                            v0 += double(c.scores[size_t(o * kept0 + i)]);
                        }
                        ranked.push_back({v, p}), by_compression.push_back({v0, p});
                    }
                    auto top = [&](std::vector<std::pair<double, int32_t>> v) {
                        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second > b.second); });
                        std::vector<int32_t> out;
                        for (int64_t i = 0; i < keepc; ++i) out.push_back(v[size_t(i)].second);
                        std::sort(out.begin(), out.end());
                        return out;
                    };
                    const std::vector<int32_t> want = top(ranked);
                    ++checks;
                    changed += want != top(by_compression);
                    const std::vector<int32_t>& now = cc.positions_now(l);
                    const int64_t w = cc.slots(l);
                    const std::vector<int32_t> got_ctx(now.begin() + row * w, now.begin() + row * w + keepc);
                    for (int64_t t = 0; t < held; ++t) EXPECT_EQ(now[size_t(row * w + keepc + t)], int32_t(T + t)) << "the decoded tokens stay";
                    // The kept context slots are the reference's top keepc. The cache sums in f32 and
                    // snapkv's pooled scores tie exactly, so a near-tie at the boundary may go either
                    // way: then every kept slot must still score within 1e-5 of every dropped one.
                    if (got_ctx != want) {
                        double kept_min = 1e300, dropped_max = -1e300, mag = 0;
                        for (const auto& [v, p] : ranked) {
                            mag = std::max(mag, std::abs(v));
                            if (std::find(got_ctx.begin(), got_ctx.end(), p) != got_ctx.end()) kept_min = std::min(kept_min, v);
                            else dropped_max = std::max(dropped_max, v);
                        }
                        EXPECT_GE(kept_min, dropped_max - 1e-5 * (1 + mag))
                            << "layer " << l << " row " << row << " after " << held << " tokens: kept " << ::testing::PrintToString(got_ctx)
                            << ", the reference's top " << ::testing::PrintToString(want);
                        ++near_ties;
                    }
                }
            };
            for (step = 0; step < int64_t(q.size()); ++step) {
                Tensor x = tiny().model.embed(Tensor::from_i32({1, 1}, {q[size_t(step)]}));
                for (int l = 0; l < L; ++l) x = tiny().model.block(l, x, T + step, spy);
            }
            // The decoded tokens' attention moves the kept set somewhere (else this proves nothing).
            EXPECT_GT(changed, 0);
            EXPECT_LE(near_ties * 10, checks) << "near-ties are the exception, not the rule";
        }
}

TEST(DecodeRescore, RefusedWithoutABudgetOrBelowZero) {
    const std::vector<int32_t> ctx = random_tokens(24, 13);
    CompressedCache cc = compressed("h2o-default", ctx, 12, 40);
    for (int64_t bad : {int64_t(1), int64_t(-1)}) {
        try {
            cc.set_decode_rescore(bad);
            FAIL() << bad;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("--kv_cache.decode_rescore_every"), std::string::npos) << e.what();
        }
    }
    RunConfig c;
    c.data.name = "niah_single";
    c.kv_cache.name = "h2o-default";
    c.protocol.name = "compress-then-ask";
    set_run_option(c, "kv_cache.decode_rescore_every", "4");
    auto problems = run_config_problems(c);
    ASSERT_FALSE(problems.empty());
    EXPECT_NE(problems.front().find("expected --kv_cache.decode_ratio with it"), std::string::npos) << problems.front();
    set_run_option(c, "kv_cache.decode_ratio", "0.5");
    EXPECT_TRUE(run_config_problems(c).empty());
    EXPECT_EQ(run_config_from_json(run_config_to_json(c), "test").protocol.decode_rescore_every, 4);
    EXPECT_EQ(RunConfig{}.protocol.decode_rescore_every, 0) << "default: never re-score (the compression's scores)";
}

}  // namespace
}  // namespace kv::test
