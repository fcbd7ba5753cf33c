// Layer labels name each layer's type (issue 40): a recorded tiny-gemma3 eval (layers 0, 1, 3, 4
// sliding with a window of 64; 2 and 5 full) stores layer_kinds in its summary, the eviction
// map and the cell grid read them, and the labels say "window 64" for exactly those layers.
#include <gtest/gtest.h>

#include "views/cell_grid.h"
#include "views/eviction_map.h"
#include "views/layer_label.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

TEST(LayerLabel, FullLayersStayPlainAndOthersSayTheirKind) {
    const std::vector<std::string> k = layer_kinds_of_summary(
        R"({"kv_bytes": 1, "layer_kinds": ["window 512", "full", "shared with layer 0", "convolution", "full, NoPE"]})");
    ASSERT_EQ(k.size(), 5u);
    EXPECT_EQ(layer_label(0, k), "layer 0 (window 512)");
    EXPECT_EQ(layer_label(1, k), "layer 1");
    EXPECT_EQ(layer_label(2, k), "layer 2 (shared with layer 0)");
    EXPECT_EQ(layer_label(3, k), "layer 3 (convolution)");
    EXPECT_EQ(layer_label(4, k), "layer 4 (full, NoPE)");
    EXPECT_EQ(layer_label(5, k), "layer 5");  // beyond the list: plain
    // a summary without them (a live run, an older session) or not JSON: plain labels
    EXPECT_TRUE(layer_kinds_of_summary("").empty());
    EXPECT_TRUE(layer_kinds_of_summary(R"({"kv_bytes": 1})").empty());
    EXPECT_TRUE(layer_kinds_of_summary("{not json").empty());
    EXPECT_EQ(layer_label(0, {}), "layer 0");
}

TEST(LayerLabel, AGemma3RunsViewsNameItsWindowedLayers) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("gemma3.kvlab");
    RunConfig cfg = test::tiny_eval_config("h2o-default", 96, 256, 1, 32);
    cfg.model = "tiny-gemma3";
    const int64_t run = test::record_tiny_runs(path, {cfg}).front();
    storage::SessionReader reader(path);

    EvictionMapViewState e;
    e.run = run;
    e.refresh_budget_ms = test::kWholeRefresh;
    while (refresh_eviction_map(e, reader)) {
    }
    CellGridViewState g;
    g.run = run;
    g.refresh_budget_ms = test::kWholeRefresh;
    while (refresh_cell_grid(g, reader)) {
    }
    const std::vector<std::string> want = {"window 64", "window 64", "full", "window 64", "window 64", "full"};
    EXPECT_EQ(e.layer_kinds, want);
    EXPECT_EQ(g.layer_kinds, want);
    EXPECT_EQ(layer_label(0, e.layer_kinds), "layer 0 (window 64)");
    EXPECT_EQ(layer_label(2, e.layer_kinds), "layer 2");
}

}  // namespace
}  // namespace kv::views
