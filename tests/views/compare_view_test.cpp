// Compare view: the configuration diff lists exactly the fields that differ (checked against a
// flattening of the stored configs done here), the metrics table's ratios, synchronized
// eviction maps, and a headless draw with the memory overlay.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "storage/session.h"
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

}  // namespace
}  // namespace kv::views
