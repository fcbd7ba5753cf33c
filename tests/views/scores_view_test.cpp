// Scores view and colour maps: the colour map rises monotonically in luminance, score colours
// are monotone in the score, histograms count every slot once, sorted heatmap rows descend,
// the view keeps the newest full array per layer (incrementally), and draws headless.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "views/colormap.h"
#include "views/scores_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

TEST(Colormap, LuminanceRisesStrictlyAndEndsDiffer) {
    const Colour* t = colormap_table();
    for (int i = 1; i < 256; ++i) EXPECT_GT(colour_luminance(t[i]), colour_luminance(t[i - 1])) << i;
    EXPECT_LT(colour_luminance(t[0]), 0.05);
    EXPECT_GT(colour_luminance(t[255]), 0.7);
    EXPECT_EQ(colormap(-3.f), t[0]);
    EXPECT_EQ(colormap(7.f), t[255]);
    EXPECT_EQ(colormap(std::nanf("")), kNoDataColour);
    // Every colour is opaque and the table is deterministic.
    for (int i = 0; i < 256; ++i) EXPECT_EQ(colour_a(t[i]), 255);
}

TEST(Colormap, CategoryColoursAreDistinct) {
    for (size_t a = 0; a < kNumMemCategories; ++a)
        for (size_t b = a + 1; b < kNumMemCategories; ++b)
            EXPECT_NE(mem_category_colour(MemCategory(a)), mem_category_colour(MemCategory(b))) << a << " " << b;
    for (int i = 0; i < 8; ++i) EXPECT_NE(series_colour(i), series_colour(i + 1));
}

TEST(Scores, ScoreColourIsMonotoneInTheScore) {
    double prev = -1;
    for (int i = 0; i <= 1000; ++i) {
        const double y = colour_luminance(score_colour(float(i) / 1000.f));
        EXPECT_GE(y, prev) << i;
        prev = y;
    }
    EXPECT_EQ(score_colour(std::nanf("")), kNoDataColour);
    EXPECT_NE(score_colour(INFINITY), score_colour(1.f)) << "protected slots have their own colour";
}

TEST(Scores, HistogramCountsEveryValueOnce) {
    const float v[] = {0.f, 1.f, 2.f, 3.f, 4.f, INFINITY, 10.f, NAN, 10.f};
    const ScoreHistogram h = score_histogram(v, 9, 5);
    EXPECT_EQ(h.total(), 9);
    EXPECT_EQ(h.nonfinite, 2);
    EXPECT_DOUBLE_EQ(h.lo, 0);
    EXPECT_DOUBLE_EQ(h.hi, 10);
    const std::vector<int64_t> want = {2, 2, 1, 0, 2};  // width 2: [0,2) [2,4) [4,6) [6,8) [8,10]
    EXPECT_EQ(h.counts, want);
    const ScoreHistogram same = score_histogram(v, 1, 4);  // one value: everything in one bin
    EXPECT_EQ(same.total(), 1);
    EXPECT_EQ(same.counts[0], 1);
}

class ScoresRun : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("run.kvlab");
        run_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 64, 256, 1)}).front();
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static int64_t run_;
};
test::ViewsScratchDir* ScoresRun::dir_ = nullptr;
std::string ScoresRun::path_;
int64_t ScoresRun::run_ = 0;

TEST_F(ScoresRun, KeepsTheNewestFullArrayPerLayer) {
    storage::SessionReader reader(path_);
    ScoresViewState s;
    s.run = run_;
    ASSERT_TRUE(refresh_scores(s, reader));
    ASSERT_EQ(s.layers.size(), 2u);
    for (int l = 0; l < 2; ++l) {
        auto rows = reader.score_snapshots(run_, l, 0, true);
        const auto newest = *std::max_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
        EXPECT_EQ(s.layers[size_t(l)].id, newest.id);
        EXPECT_EQ(s.layers[size_t(l)].values, newest.values);
        // Histogram of one head counts its T slots exactly once; all heads count B*G*T.
        const LayerScores& ls = s.layers[size_t(l)];
        const ScoreHistogram one = score_histogram(ls.values.data() + ls.T, size_t(ls.T), 32);
        EXPECT_EQ(one.total(), ls.T);
        const ScoreHistogram all = score_histogram(ls.values.data(), ls.values.size(), 32);
        EXPECT_EQ(all.total(), int64_t(ls.B) * ls.G * ls.T);
        // Recount one bin by hand from the bin edges.
        const double w = (all.hi - all.lo) / 32;
        int64_t bin5 = 0;
        for (float v : ls.values)
            if (std::isfinite(v) && std::min(31, int((v - all.lo) / w)) == 5) ++bin5;
        EXPECT_EQ(all.counts[5], bin5);
    }
    EXPECT_FALSE(refresh_scores(s, reader)) << "nothing new";
}

TEST_F(ScoresRun, SortedRowsDescendAndNormalizedValuesSpanZeroToOne) {
    storage::SessionReader reader(path_);
    ScoresViewState s;
    s.run = run_;
    refresh_scores(s, reader);
    ScoresImageOptions o;
    o.sorted = true;
    const ScoresImage img = build_scores_image(s.layers, o);
    ASSERT_EQ(img.height, 4) << "2 layers x 2 KV heads";
    ASSERT_EQ(img.width, 64);
    for (int r = 0; r < img.height; ++r) {
        float prev = INFINITY;
        float lo = INFINITY, hi = -INFINITY;
        for (int x = 0; x < img.width; ++x) {
            const float v = img.raw[size_t(r) * img.width + x];
            if (std::isnan(v)) continue;
            EXPECT_LE(v, prev) << "row " << r << " col " << x;
            prev = v;
            const float n = img.norm[size_t(r) * img.width + x];
            if (std::isfinite(n)) lo = std::min(lo, n), hi = std::max(hi, n);
        }
        EXPECT_GE(lo, 0.f);
        EXPECT_LE(hi, 1.f);
    }
    // By slot: texel x of row (layer 1, head 0) is exactly slot x's score.
    const ScoresImage by_slot = build_scores_image(s.layers, {});
    for (int x = 0; x < by_slot.width; ++x) {
        const float want = s.layers[1].values[size_t(x)];
        const float got = by_slot.raw[size_t(2) * by_slot.width + x];
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(got));
        else EXPECT_EQ(got, want);
    }
    // Hit test: the texel under a point names its layer, head and slot.
    const ScoresHit h = scores_hit_test(by_slot, false, ImVec2(0, 0), ImVec2(640, 40), ImVec2(125, 25));
    ASSERT_TRUE(h.valid);
    EXPECT_EQ(h.layer, 1);
    EXPECT_EQ(h.head, 0);
    EXPECT_EQ(h.slot_lo, 12);
    // One head only: one row per layer.
    ScoresImageOptions one;
    one.head = 1;
    EXPECT_EQ(build_scores_image(s.layers, one).height, 2);
}

TEST(Scores, IncrementalRefreshFollowsNewerSnapshots) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("scores.kvlab"), R"({"mode":"eval_long"})", 2);  // full arrays every 2nd chunk
    storage::SessionReader reader(run.path());
    ScoresViewState s;
    s.run = run.run();
    auto write = [&](int chunk, float base) {
        run.produce([&] {
            std::vector<float> v(2 * 8);
            for (size_t i = 0; i < v.size(); ++i) v[i] = base + float(i);
            trace::scores(0, chunk, v.data(), 1, 2, 8);
            trace::scores(1, chunk, v.data(), 1, 2, 8);
        });
        run.flush();
    };
    write(0, 0);
    write(1, 100);  // summary only (odd chunk)
    ASSERT_TRUE(refresh_scores(s, reader));
    EXPECT_EQ(s.layers.at(0).chunk, 0);
    EXPECT_EQ(s.layers[0].values.front(), 0.f);
    write(2, 200);
    ASSERT_TRUE(refresh_scores(s, reader));
    EXPECT_EQ(s.layers[0].chunk, 2);
    EXPECT_EQ(s.layers[1].values.back(), 215.f);
    ScoresViewState fresh;
    fresh.run = run.run();
    refresh_scores(fresh, reader);
    for (size_t l = 0; l < 2; ++l) {
        EXPECT_EQ(fresh.layers[l].id, s.layers[l].id);
        EXPECT_EQ(fresh.layers[l].values, s.layers[l].values);
    }
}

TEST_F(ScoresRun, DrawsHeadless) {
    storage::SessionReader reader(path_);
    ScoresViewState s;
    s.run = run_;
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    h.window_frame([&] { DrawScoresView(s, &host); });  // empty state before any refresh
    refresh_scores(s, reader);
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawScoresView(s, &host); }, ImVec2(400, 150));
    EXPECT_GT(vtx, 0);
    ASSERT_EQ(host.live.size(), 1u);
    EXPECT_EQ(host.live.begin()->second.width, 64);
    EXPECT_EQ(host.live.begin()->second.height, 4);
    release_scores_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
}

// An attention sink: one slot scoring far above the rest (SmolLM2's layers 12-29 under h2o:
// max ~340 against a 99th percentile ~4). Linear colours leave the rest dark (and the view says
// why); the rank scale spreads them over the colour map.
TEST(Scores, ASinkSlotIsNamedAndTheRankScaleShowsTheRest) {
    LayerScores normal, sink;
    for (LayerScores* l : {&normal, &sink}) {
        l->id = 1, l->B = 1, l->G = 1, l->T = 101;
        for (int i = 0; i < 101; ++i) l->values.push_back(1.0f + 0.01f * float(i));  // 1.00 .. 2.00, distinct
    }
    sink.values[0] = 340.f;  // slot 0 is the sink
    normal.stats.max = 2.0f, normal.stats.p99 = 1.99f;
    sink.stats.max = 340.f, sink.stats.p99 = 2.0f;
    const std::vector<LayerScores> layers = {normal, sink};
    EXPECT_EQ(score_outlier_layers(layers), std::vector<int>{1});
    ScoresImageOptions linear;
    const ScoresImage lin = build_scores_image(layers, linear);
    ScoresImageOptions by_rank;
    by_rank.rank = true;
    const ScoresImage rk = build_scores_image(layers, by_rank);
    ASSERT_EQ(rk.width, 101);
    ASSERT_EQ(rk.height, 2);
    // Linear: every non-sink slot of the sink layer sits in the bottom 0.3% of its colours.
    for (int x = 1; x < 101; ++x) EXPECT_LT(lin.norm[size_t(101 + x)], 0.003f);
    // Rank: slot x's value is the x-th smallest of the other 100 (the sink is the largest), so
    // its rank is (x - 1) / 100; in the normal layer slot x is simply x / 100.
    for (int x = 1; x < 101; ++x) EXPECT_NEAR(rk.norm[size_t(101 + x)], float(x - 1) / 100.f, 1e-6f) << x;
    EXPECT_NEAR(rk.norm[size_t(101)], 1.f, 1e-6f);
    for (int x = 0; x < 101; ++x) EXPECT_NEAR(rk.norm[size_t(x)], float(x) / 100.f, 1e-6f) << x;
    // Raw values are the scores either way (the tooltip shows them).
    EXPECT_EQ(rk.raw[size_t(101)], 340.f);
}

}  // namespace
}  // namespace kv::views
