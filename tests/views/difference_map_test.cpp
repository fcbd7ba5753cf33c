// Difference map: counts and texels checked against the two runs' replay logs decoded and
// replayed here, slot table by slot table (test::layer_plans, independent of the views'
// decoder and of their held-interval bookkeeping); runs cut differently give a message.
#include <gtest/gtest.h>

#include <set>

#include "views/canvas_impl.h"
#include "views/compare_view.h"
#include "views/difference_map.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

// Positions held in row `row` after each step: the slot tables replayed from the plans
// (moves read before they are written, then the chunk's tokens).
std::vector<std::set<int64_t>> held_after_each_step(const std::vector<SlotPlan>& plans, int row) {
    std::vector<int64_t> slots;
    std::vector<std::set<int64_t>> out;
    for (const SlotPlan& p : plans) {
        const int64_t r = p.rows == 1 ? 0 : row;
        std::vector<int64_t> moved;
        for (int64_t m = 0; m < p.moves; ++m) {
            const size_t from = size_t(p.move_from[size_t(r * p.moves + m)]);
            moved.push_back(from < slots.size() ? slots[from] : -1);
        }
        for (int64_t m = 0; m < p.moves; ++m) {
            const size_t to = size_t(p.move_to[size_t(r * p.moves + m)]);
            if (slots.size() <= to) slots.resize(to + 1, -1);
            slots[to] = moved[size_t(m)];
        }
        for (int64_t t = 0; t < p.n; ++t) {
            const size_t to = size_t(p.targets[size_t(r * p.n + t)]);
            if (slots.size() <= to) slots.resize(to + 1, -1);
            slots[to] = p.input_pos + t;
        }
        std::set<int64_t> held;
        for (int64_t v : slots)
            if (v >= 0) held.insert(v);
        out.push_back(held);
    }
    return out;
}

EvictionData load(const std::string& path, int64_t run) {
    storage::SessionReader reader(path);
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run;
    for (int i = 0; i < 100 && refresh_eviction_map(s, reader); ++i) {
    }
    EXPECT_EQ(s.error, "");
    return s.data;
}

TEST(DifferenceMap, CountsAndTexelsMatchTheReplayedSlotTables) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("diff.kvlab");
    // Same model, data and chunks; two policies that keep different tokens; and a dense run,
    // whose single prefill step cuts the sample differently.
    const auto runs = test::record_tiny_runs(path, {test::tiny_eval_config("h2o-default", 64, 256, 2, 16),
                                                    test::tiny_eval_config("lastrec-default", 64, 256, 2, 16),
                                                    test::tiny_eval_config("dense-default", 0, 256, 2, 16)});
    const EvictionData a = load(path, runs[0]), b = load(path, runs[1]), dense = load(path, runs[2]);
    storage::SessionReader reader(path);
    int64_t differing = 0;
    for (int seq = 0; seq < 2; ++seq)
        for (int layer = 0; layer < 2; ++layer) {
            const auto pa = test::layer_plans(reader, runs[0], layer, seq), pb = test::layer_plans(reader, runs[1], layer, seq);
            ASSERT_EQ(pa.size(), pb.size());
            ASSERT_GT(pa.size(), 4u);
            const auto ha = held_after_each_step(pa, 0), hb = held_after_each_step(pb, 0);
            DifferenceCounts want;
            const int64_t tokens = pa.back().input_pos + pa.back().n;
            const DifferenceImage img = build_difference_image(a, seq, b, seq, layer, 0);
            ASSERT_EQ(img.error, "");
            ASSERT_EQ(img.width, int(pa.size()));  // one texel per (step, position) at this size
            ASSERT_EQ(img.height, int(tokens));
            for (size_t step = 0; step < pa.size(); ++step)
                for (int64_t pos = 0; pos < tokens; ++pos) {
                    const bool in_a = ha[step].count(pos) > 0, in_b = hb[step].count(pos) > 0;
                    want.both += in_a && in_b, want.only_a += in_a && !in_b, want.only_b += in_b && !in_a;
                    const Colour expect = in_a && in_b ? kDiffBothColour : in_a ? kDiffOnlyAColour : in_b ? kDiffOnlyBColour : kNoDataColour;
                    const uint8_t* px = img.rgba.data() + (size_t(pos) * size_t(img.width) + step) * 4;
                    ASSERT_EQ(pack_rgba(px[0], px[1], px[2], px[3]), expect) << "step " << step << " position " << pos;
                }
            EXPECT_EQ(img.counts.both, want.both);
            EXPECT_EQ(img.counts.only_a, want.only_a);
            EXPECT_EQ(img.counts.only_b, want.only_b);
            differing += want.only_a + want.only_b;
            // A against itself: everything held by both.
            const DifferenceImage same = build_difference_image(a, seq, a, seq, layer, 0);
            EXPECT_EQ(same.counts.only_a + same.counts.only_b, 0);
            EXPECT_EQ(same.counts.both, want.both + want.only_a);
        }
    EXPECT_GT(differing, 0) << "h2o and lastrec should keep different tokens";
    // Binned (2 x 2 texels): the counts stay exact.
    const DifferenceImage full = build_difference_image(a, 0, b, 0, 0, 0);
    const DifferenceImage binned = build_difference_image(a, 0, b, 0, 0, 0, (full.width + 1) / 2, (full.height + 1) / 2);
    EXPECT_EQ(binned.steps_per_texel, 2);
    EXPECT_EQ(binned.tokens_per_texel, 2);
    EXPECT_EQ(binned.counts.both, full.counts.both);
    EXPECT_EQ(binned.counts.only_a, full.counts.only_a);
    // Different chunking: a message naming both plans, no image.
    const DifferenceImage bad = build_difference_image(dense, 0, a, 0, 0, 0);
    EXPECT_EQ(bad.width, 0);
    EXPECT_NE(bad.error.find("cut the sample differently"), std::string::npos) << bad.error;
    // Reachable from compare: the view builds it for the chosen pair.
    test::ImGuiHarness h(1280, 800);
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    canvas.open_session(path);
    canvas.select_runs({runs[0], runs[1]});
    for (int i = 0; i < 50 && (canvas.refresh() || canvas.has_draw_requests()); ++i) canvas.serve_draw_requests();
    CompareViewState& c = canvas.impl().state<CompareViewState>();
    c.show_difference = true;
    c.sequence = 0;
    for (int f = 0; f < 2; ++f) h.frame([&] { canvas.draw(1280, 800); });
    EXPECT_EQ(c.difference.error, "");
    EXPECT_EQ(c.difference.counts.both, full.counts.both);
    EXPECT_EQ(c.difference.counts.only_a, full.counts.only_a);
    ASSERT_TRUE(host.live.count(c.difference_texture));
    EXPECT_EQ(host.live.at(c.difference_texture).width, full.width);
}

}  // namespace
}  // namespace kv::views
