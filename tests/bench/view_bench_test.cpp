// The view benchmark at a tiny scale: the synthetic session holds what it promises and every
// scenario runs its frames (timings themselves belong to docs/PERFORMANCE.md, not to tests).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "bench/view_bench.h"
#include "../views/views_test_util.h"

namespace kv::views {
namespace {

TEST(ViewBench, SmallSyntheticSessionRunsEveryScenario) {
    test::ViewsScratchDir dir;
    ViewBenchOptions o;
    o.tokens = 4096;
    o.layers = 3;
    o.kv_heads = 2;
    o.cache_length = 512;
    o.chunk_size = 256;
    o.memory_events = 20000;
    o.spans = 2000;
    o.cells = 8;
    o.frames = 3;
    o.width = 1200, o.height = 800;
    o.dir = dir.file("");
    o.live_run = false;
    test::RecordingTextureHost host;
    const ViewBenchResult r = run_view_bench(host, o);
    EXPECT_EQ(r.memory_events, 20000);
    EXPECT_EQ(r.spans, 2000 + 3 * 15 + 8) << "op spans + chunk spans (3 layers x 15 steps) + cell spans";
    EXPECT_EQ(r.cache_steps, 3 * 15);
    EXPECT_GE(r.memory_load_refreshes, 1);
    ASSERT_GE(r.scenarios.size(), 10u);
    for (const auto& s : r.scenarios) {
        EXPECT_EQ(s.frames, 3) << s.name;
        EXPECT_GT(s.wall_ms_mean, 0) << s.name;
    }
    EXPECT_GT(r.texture_uploads, 3);
    EXPECT_TRUE(host.live.empty()) << "textures handed back";
    EXPECT_NE(format_view_bench(r).find("memory timeline"), std::string::npos);
}

}  // namespace
}  // namespace kv::views

namespace kv::views {
namespace {

// The full-size benchmark (128k tokens x 24 layers, 10M memory events, a live `small` run).
// Minutes, not seconds: run on demand with
//   kvlab_bench_tests --gtest_also_run_disabled_tests --gtest_filter='ViewBench.DISABLED_FullScale'
// The texture host copies the pixels as a GL upload would read them, and keeps nothing else.
TEST(ViewBench, DISABLED_FullScale) {
    class CopyingHost : public TextureHost {
       public:
        uint64_t upload_rgba(uint64_t id, int w, int h, const uint8_t* px) override {
            staging.assign(px, px + size_t(w) * size_t(h) * 4);
            return id ? id : next++;
        }
        void release(uint64_t) override {}
        std::vector<uint8_t> staging;
        uint64_t next = 1;
    } host;
    ViewBenchOptions o;
    if (const char* d = std::getenv("KVLAB_VIEW_BENCH_DIR")) o.dir = d;
    if (const char* s = std::getenv("KVLAB_VIEW_BENCH_SESSION")) o.session = s;
    o.keep_session = std::getenv("KVLAB_VIEW_BENCH_KEEP") != nullptr;
    if (const char* only = std::getenv("KVLAB_VIEW_BENCH_ONLY")) o.only = only, o.live_run = false;
    const ViewBenchResult r = run_view_bench(host, o);
    std::printf("%s", format_view_bench(r).c_str());
    if (o.keep_session) std::printf("session kept: %s\n", r.session.c_str());
    EXPECT_FALSE(r.scenarios.empty());
}

}  // namespace
}  // namespace kv::views
