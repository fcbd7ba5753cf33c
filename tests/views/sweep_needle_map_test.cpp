// The sweep view's needle heat map: from a synthetic session of needle runs (data.depths set,
// sample_correct per sample), each cell is the mean of the samples at that depth and length of
// that cache, computed here by brute force; runs without depths are not in the grid; the view
// draws the map headless when asked.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/telemetry/trace.h"
#include "storage/needle_grid.h"
#include "storage/session_reader.h"
#include "views/sweep_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

std::string needle_config(const std::string& cache, int64_t T, const std::string& depths) {
    return R"({"mode":"eval_long","data":{"name":"niah_single","seq_length":)" + std::to_string(T) + R"(,"depths":")" + depths +
           R"(","num_samples":6},"kv_cache":{"name":")" + cache + R"("},"protocol":{"name":"compress-then-ask"}})";
}

// Sample i of (cache c, length T) found its needle: a fixed pattern that differs per cell.
double found(int c, int64_t T, int i) { return ((i * 7 + c * 3 + int(T / 512)) % 5) < 2 ? 1.0 : 0.0; }

TEST(SweepNeedleMap, CellsAreTheMeansOfTheirSamples) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("needles.kvlab");
    const std::vector<std::string> caches = {"snapkv-default", "knorm-default"};
    const std::vector<int64_t> lengths = {512, 1024};
    const std::vector<double> depths = {0, 0.5, 1};
    for (int c = 0; c < 2; ++c)
        for (int64_t T : lengths) {
            test::SyntheticRun run(path, needle_config(caches[size_t(c)], T, "0,0.5,1"));
            run.produce([&] {
                for (int i = 0; i < 6; ++i) trace::metric("sample_correct", i, found(c, T, i));
            });
        }
    {  // a run without depths: not a needle cell
        test::SyntheticRun other(path, R"({"mode":"eval_long","data":{"name":"niah_single","seq_length":2048},"kv_cache":{"name":"h2o-default"}})");
        other.produce([&] { trace::metric("sample_correct", 0, 1.0); });
    }
    storage::SessionReader reader(path);
    SweepViewState s;
    refresh_sweep(s, reader);
    const storage::NeedleGrid& g = s.needle;
    ASSERT_EQ(g.depths, depths);
    ASSERT_EQ(g.lengths, lengths);
    ASSERT_EQ(g.panels.size(), 2u);
    for (int c = 0; c < 2; ++c) {
        EXPECT_EQ(g.panels[size_t(c)].title, caches[size_t(c)]);
        for (size_t r = 0; r < 3; ++r)
            for (size_t k = 0; k < 2; ++k) {
                // Brute force: samples i with i mod 3 == r sit at depth r.
                double sum = 0;
                int n = 0;
                for (int i = 0; i < 6; ++i)
                    if (i % 3 == int(r)) sum += found(c, lengths[k], i), ++n;
                EXPECT_DOUBLE_EQ(g.panels[size_t(c)].values[r][k], sum / n) << caches[size_t(c)] << " depth " << depths[r] << " T " << lengths[k];
                EXPECT_EQ(g.panels[size_t(c)].samples[r][k], n);
            }
    }
    // Drawn headless, with and without the map.
    test::ImGuiHarness h(1000, 600);
    EXPECT_GT(h.window_frame([&] { DrawSweepView(s); }), 0);
    s.needle_map = true;
    EXPECT_GT(h.window_frame([&] { DrawSweepView(s); }), 0);
}

}  // namespace
}  // namespace kv::views
