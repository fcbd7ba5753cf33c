// Compare view: the configuration diff lists exactly the fields that differ (checked against a
// flattening of the stored configs done here), the metrics table's ratios, synchronized
// eviction maps, and a headless draw with the memory overlay.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>
#include <set>

#include "storage/config_fields.h"
#include "storage/session.h"
#include "views/canvas_impl.h"
#include "views/compare_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

void flatten(const nlohmann::json& j, const std::string& prefix, std::map<std::string, std::string>& out) {
    if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) flatten(*it, prefix.empty() ? it.key() : prefix + "." + it.key(), out);
    else
        out[prefix] = j.dump();
}

class CompareRuns : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("runs.kvlab");
        RunConfig a = test::tiny_eval_config("h2o-default", 64);
        RunConfig b = test::tiny_eval_config("lastrec-default", 64);
        RunConfig c = test::tiny_eval_config("h2o-default", 96, 256, 2, 32);
        runs_ = test::record_tiny_runs(path_, {a, b, c});
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
};
test::ViewsScratchDir* CompareRuns::dir_ = nullptr;
std::string CompareRuns::path_;
std::vector<int64_t> CompareRuns::runs_;

TEST_F(CompareRuns, ConfigDiffListsOnlyDifferingFields) {
    storage::SessionReader reader(path_);
    CompareViewState s;
    compare_select(s, runs_, runs_[1], nullptr);  // lastrec is the reference
    ASSERT_TRUE(refresh_compare(s, reader));
    ASSERT_TRUE(s.have_comparison) << s.comparison_error;
    ASSERT_EQ(s.comparison.runs.size(), 3u);
    EXPECT_EQ(s.comparison.runs[0].id, runs_[1]) << "reference first";
    std::vector<std::map<std::string, std::string>> flat;
    for (const auto& r : s.comparison.runs) {
        flat.emplace_back();
        flatten(nlohmann::json::parse(reader.run(r.id).config), "", flat.back());
    }
    std::set<std::string> want;
    for (const auto& m : flat)
        for (const auto& [k, v] : m) {
            bool differs = false;
            for (const auto& o : flat) differs |= !o.count(k) || o.at(k) != v;
            if (differs) want.insert(k);
        }
    const std::set<std::string> got(s.comparison.differing_fields.begin(), s.comparison.differing_fields.end());
    EXPECT_EQ(got, want);
    EXPECT_TRUE(got.count("kv_cache.name"));
    EXPECT_TRUE(got.count("kv_cache.cache_length"));
    EXPECT_FALSE(got.count("data.seq_length")) << "equal everywhere: not listed";
    EXPECT_FALSE(got.count("model"));
    for (const auto& r : s.comparison.runs) EXPECT_EQ(r.config_diff.size(), got.size());

    // Metrics table: ratios and differences against the reference.
    const auto rows = compare_metric_rows(s.comparison);
    bool saw_speed = false, saw_kv = false;
    for (const auto& row : rows) {
        ASSERT_EQ(row.values.size(), 3u);
        if (row.name == "tokens/s") {
            saw_speed = true;
            for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(row.relative[i], row.values[i] / row.values[0], 1e-9);
        }
        if (row.name == "KV bytes") {
            saw_kv = true;
            EXPECT_NEAR(row.relative[2], 96.0 / 64.0, 1e-9) << "1.5x the slots";
        }
        if (row.name == "loss") {
            EXPECT_TRUE(row.difference);
            EXPECT_DOUBLE_EQ(row.relative[0], 0.0);
        }
    }
    EXPECT_TRUE(saw_speed);
    EXPECT_TRUE(saw_kv);
}

TEST_F(CompareRuns, MapsFollowOneSelectionAndEverythingDraws) {
    storage::SessionReader reader(path_);
    CompareViewState s;
    compare_select(s, {runs_[0], runs_[2]}, 0, nullptr);  // both h2o: one slot table per KV head
    // The comparison comes from the read-only reader too. Each map reads within its share of a
    // frame's time budget and says when more waits (as the GUI's next frames would): refresh
    // until nothing new, or a loaded machine leaves the maps at their first layer.
    for (int i = 0; i < 1000 && refresh_compare(s, reader); ++i) {
    }
    EXPECT_TRUE(s.have_comparison) << s.comparison_error;
    EXPECT_TRUE(s.comparison_error.empty());
    ASSERT_EQ(s.maps.size(), 2u);
    for (const auto& m : s.maps) EXPECT_EQ(m.data.sequences.size(), 2u);
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    s.layer = 1;
    s.head = 1;
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawCompareView(s, &host); });
    EXPECT_GT(vtx, 0);
    for (const auto& m : s.maps) {
        EXPECT_EQ(m.layer, 1);
        EXPECT_EQ(m.head, 1);
        EXPECT_EQ(m.main.image.spec.layer, 1);
    }
    EXPECT_EQ(host.live.size(), 2u) << "one texture per compared run";
    // A zoom in one map becomes everyone's window.
    s.maps[1].follow = false;
    s.follow = false;
    s.steps_range = {2, 6};
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawCompareView(s, &host); });
    for (const auto& m : s.maps) EXPECT_EQ(m.steps_range, (AxisRange{2, 6}));
    release_compare_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
}

// The case: five runs side by side, the first the sweep's one-step dense reference (its
// whole sample in one chunk), one of them longer than the rest.
class FiveRuns : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("five.kvlab");
        runs_ = test::record_tiny_runs(path_, {test::tiny_eval_config("dense-default", 0, 256, 2, 256),
                                               test::tiny_eval_config("h2o-default", 96, 256, 2, 16),
                                               test::tiny_eval_config("lastrec-default", 96, 256, 2, 16),
                                               test::tiny_eval_config("tova-default", 96, 256, 2, 16),
                                               test::tiny_eval_config("streaming-default", 96, 384, 2, 16)});
    }
    static void TearDownTestSuite() { delete dir_; }
    // The compare view of `runs` drawn on a w x h canvas until its state settles.
    static void draw_compare(test::ImGuiHarness& h, Canvas& canvas, const std::vector<int64_t>& runs) {
        canvas.open_session(path_);
        canvas.select_runs(runs);
        EXPECT_EQ(canvas.view(), view_named("compare"));
        for (int i = 0; i < 200 && (canvas.refresh() || canvas.has_draw_requests()); ++i) canvas.serve_draw_requests();
        for (int f = 0; f < 3; ++f) h.frame([&] { canvas.draw(h.width(), h.height()); });
    }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
};
test::ViewsScratchDir* FiveRuns::dir_ = nullptr;
std::string FiveRuns::path_;
std::vector<int64_t> FiveRuns::runs_;

TEST_F(FiveRuns, EveryMapAtLeastTheMinimumAndReachableOnA1600x1000Canvas) {
    for (const ImVec2 size : {ImVec2(1600, 1000), ImVec2(1180, 620), ImVec2(700, 500)}) {
        test::ImGuiHarness h(size.x, size.y);
        test::RecordingTextureHost host;
        Canvas canvas(&host);
        draw_compare(h, canvas, runs_);
        const CompareViewState& c = canvas.impl().state<CompareViewState>();
        ASSERT_EQ(c.shown.maps.size(), 5u) << size.x << "x" << size.y;
        for (size_t i = 0; i < c.shown.maps.size(); ++i) {
            const ImVec4& r = c.shown.maps[i];
            EXPECT_GE(r.z - r.x, kCompareMinPanel) << "map " << i << " at " << size.x << "x" << size.y;
            // On screen, or within the scrolled region's reach.
            EXPECT_GE(r.x, c.shown.body.x - 0.5f);
            EXPECT_LE(r.z, c.shown.body.z + c.shown.scroll_max_x + 0.5f) << "map " << i << " at " << size.x << "x" << size.y;
            EXPECT_LE(r.w, c.shown.body.w + c.shown.scroll_max_y + 0.5f) << "map " << i << " at " << size.x << "x" << size.y;
            for (size_t j = 0; j < i; ++j) {  // no two panels overlap
                const ImVec4& q = c.shown.maps[j];
                EXPECT_TRUE(r.x >= q.z || q.x >= r.z || r.y >= q.w || q.y >= r.w) << i << " overlaps " << j;
            }
            EXPECT_FALSE(c.maps[i].colour_key) << "one colour bar for all maps, not one per panel";
        }
        EXPECT_EQ(c.shown.colour_keys, 1);
        if (size.x == 1600) {
            // The window: all five on screen at once, and the memory overlay a real share.
            for (const ImVec4& r : c.shown.maps) EXPECT_LE(r.w, c.shown.body.w + 0.5f) << "all five visible without scrolling";
            EXPECT_EQ(c.shown.scroll_max_y, 0.f);
            EXPECT_GE(c.shown.memory_height, 0.2f * size.y);
        }
        if (size.x == 700) {
            EXPECT_GT(c.shown.scroll_max_y, 0.f) << "too small for the minimums: it scrolls";
        }
    }
}

TEST_F(FiveRuns, MemoryLinesEndAtTheirRunsLastToken) {
    test::ImGuiHarness h(1600, 1000);
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    draw_compare(h, canvas, runs_);
    const CompareViewState& c = canvas.impl().state<CompareViewState>();
    storage::SessionReader reader(path_);
    ASSERT_EQ(c.shown.memory_ends.size(), 5u);
    for (size_t i = 0; i < c.infos.size(); ++i) {
        // Tokens the run processed, from its config: every sample but its last token (only a
        // target, never fed), sample after sample.
        const auto cfg = [&](const char* k) { return std::stod(storage::run_config_value(reader.run(c.infos[i].id).config, k)); };
        const double tokens = (cfg("data.seq_length") - 1) * cfg("data.num_samples");
        EXPECT_DOUBLE_EQ(c.shown.memory_ends[i], tokens) << "run " << c.infos[i].id << " (" << c.infos[i].name << ")";
    }
    // The shorter runs end two thirds along the axis, not drawn on flat to its end.
    EXPECT_LT(c.shown.memory_ends.front(), c.shown.memory_ends.back());
}

TEST(MemoryOverProgress, EachChunksPeakSpansItsTokensAndTheLineStopsAtTheRunsEnd) {
    MemorySeries s;
    // (t, device total after the event): a loading transient, then two chunks' allocations
    // and the final free.
    const int64_t totals[][2] = {{-10, 1000}, {-5, 50}, {10, 150}, {50, 300}, {60, 120}, {100, 0}};
    for (const auto& e : totals) s.raw.push_back({e[0], e[1], 0, 0, 0});
    // Chunk 0: t 0..40, tokens 0..4; chunk 1: t 40..100, tokens 4..10. The axis spans 20
    // tokens in 20 columns.
    const std::vector<ProgressKnot> knots = {{0, 0}, {40, 4}, {100, 10}};
    const std::vector<double> cols = memory_over_progress(s, knots, 20, 20);
    ASSERT_EQ(cols.size(), 20u);
    for (int c = 0; c < 4; ++c) EXPECT_EQ(cols[size_t(c)], 150) << c << ": chunk 0's peak, not the loading transient";
    for (int c = 4; c < 10; ++c) EXPECT_EQ(cols[size_t(c)], 300) << c << ": chunk 1's peak over all its tokens";
    for (int c = 10; c < 20; ++c) EXPECT_TRUE(std::isnan(cols[size_t(c)])) << c << ": past the run's end";
    // Chunk edges inside a column: the column shows the higher chunk.
    const std::vector<double> coarse = memory_over_progress(s, knots, 20, 4);  // 5 tokens a column
    EXPECT_EQ(coarse[0], 300);
    EXPECT_EQ(coarse[1], 300);
    EXPECT_TRUE(std::isnan(coarse[2]));
}

TEST_F(FiveRuns, TheDefaultDifferencePairCanBeDiffedOrTheViewSaysWhy) {
    test::ImGuiHarness h(1600, 1000);
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    draw_compare(h, canvas, runs_);
    CompareViewState& c = canvas.impl().state<CompareViewState>();
    c.show_difference = true;
    for (int f = 0; f < 2; ++f) h.frame([&] { canvas.draw(1600, 1000); });
    // The dense reference (display 0) is one step; h2o and lastrec (1 and 2) share a plan.
    EXPECT_EQ(c.infos[0].id, runs_[0]);
    EXPECT_EQ(c.difference_a, 1);
    EXPECT_EQ(c.difference_run, 2);
    EXPECT_EQ(c.difference_why, "");
    EXPECT_EQ(c.difference.error, "");
    EXPECT_GT(c.difference.counts.both + c.difference.counts.only_a + c.difference.counts.only_b, 0);
    EXPECT_TRUE(c.shown.maps.empty()) << "the difference map replaces the maps";
    // A pair the user picks stays, even one that cannot be diffed.
    c.difference_a = 0, c.difference_run = 3, c.difference_chosen = true;
    for (int f = 0; f < 2; ++f) h.frame([&] { canvas.draw(1600, 1000); });
    EXPECT_EQ(c.difference_a, 0);
    EXPECT_NE(c.difference.error, "");

    // No pair can: the one-step dense run and the longer run. One sentence naming both.
    test::RecordingTextureHost host2;
    Canvas two(&host2);
    draw_compare(h, two, {runs_[0], runs_[4]});
    CompareViewState& d = two.impl().state<CompareViewState>();
    d.show_difference = true;
    for (int f = 0; f < 2; ++f) h.frame([&] { two.draw(1600, 1000); });
    EXPECT_NE(d.difference_why.find("run " + std::to_string(runs_[0]) + " ("), std::string::npos) << d.difference_why;
    EXPECT_NE(d.difference_why.find("run " + std::to_string(runs_[4]) + " ("), std::string::npos) << d.difference_why;
    EXPECT_NE(d.difference_why.find("1 chunk step over 255 positions"), std::string::npos) << d.difference_why;
    EXPECT_NE(d.difference_why.find(" chunk steps over 383 positions"), std::string::npos) << d.difference_why;
    EXPECT_EQ(std::count(d.difference_why.begin(), d.difference_why.end(), '.'), 1) << "one sentence: " << d.difference_why;
    EXPECT_EQ(d.difference_why.back(), '.');
    EXPECT_EQ(d.shown.maps.size(), 2u) << "the maps in the difference map's place, not an empty view";
}

}  // namespace
}  // namespace kv::views
