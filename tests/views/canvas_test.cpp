// Canvas: every ViewKind draws two headless frames from a real tiny session (draw commands
// emitted, no ImGui assert), selection rules, textures handed back, clear errors for bad files,
// and a live run followed by refresh() ending equal to a fresh load.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "storage/session_file.h"
#include "views/canvas.h"
#include "views/canvas_impl.h"
#include "views/eviction_map.h"
#include "views/memory_timeline.h"
#include "views/compare_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

class CanvasRuns : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("runs.kvlab");
        runs_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 64), test::tiny_eval_config("lastrec-default", 64)});
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
};
test::ViewsScratchDir* CanvasRuns::dir_ = nullptr;
std::string CanvasRuns::path_;
std::vector<int64_t> CanvasRuns::runs_;

TEST_F(CanvasRuns, EveryViewDrawsTwoFramesWithCommands) {
    test::ImGuiHarness h(1280, 800);
    test::RecordingTextureHost host;
    {
        Canvas canvas(&host);
        canvas.open_session(path_);
        EXPECT_EQ(canvas.session_path(), path_);
        ASSERT_EQ(canvas.selected_runs(), std::vector<int64_t>{runs_.back()}) << "opening shows the newest run";
        canvas.select_runs({runs_[0]});
        for (ViewKind k : {view_named("eviction map"), view_named("scores"), view_named("memory timeline"), view_named("cell grid"),
                           view_named("metrics")}) {
            canvas.set_view(k);
            EXPECT_EQ(canvas.view(), k);
            EXPECT_TRUE(canvas.refresh()) << view_name(k);
            // A refresh stops at its time budget (a loaded machine cuts it short): drain what is
            // left, as the host's timer would, before asking that nothing more is new.
            for (int i = 0; i < 200 && canvas.refresh(); ++i) {
            }
            int vtx = 0, cmds = 0;
            for (int f = 0; f < 2; ++f) {
                vtx = h.frame([&] { canvas.draw(1280, 800); }, ImVec2(640, 450));
                cmds = 0;
                const ImDrawData* d = ImGui::GetDrawData();
                for (int l = 0; l < d->CmdListsCount; ++l) cmds += d->CmdLists[l]->CmdBuffer.Size;
            }
            EXPECT_GT(vtx, 500) << view_name(k);
            EXPECT_GT(cmds, 0) << view_name(k);
            EXPECT_FALSE(canvas.refresh()) << view_name(k) << ": nothing new in a finished run";
        }
        // Two runs: the compare view, with the comparison computed.
        canvas.select_runs(runs_);
        EXPECT_EQ(canvas.view(), view_named("compare"));
        canvas.set_reference(runs_[1]);
        canvas.refresh();
        EXPECT_TRUE(canvas.impl().state<CompareViewState>().have_comparison) << canvas.impl().state<CompareViewState>().comparison_error;
        EXPECT_EQ(canvas.impl().state<CompareViewState>().comparison.reference, runs_[1]);
        int vtx = 0;
        for (int f = 0; f < 2; ++f) vtx = h.frame([&] { canvas.draw(1280, 800); }, ImVec2(300, 500));
        EXPECT_GT(vtx, 500);
        EXPECT_FALSE(host.live.empty());
        // Back to one run: single-run views again.
        canvas.select_runs({runs_[1]});
        EXPECT_EQ(canvas.view(), view_named("eviction map"));
    }
    EXPECT_TRUE(host.live.empty()) << "the canvas hands every texture back";
}

TEST_F(CanvasRuns, EmptyAndBadSessions) {
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    EXPECT_FALSE(canvas.refresh());
    for (int f = 0; f < 2; ++f) EXPECT_GT(h.frame([&] { canvas.draw(800, 600); }), 0) << "an explicit empty state";
    EXPECT_THROW(canvas.open_session(dir_->file("missing.kvlab")), storage::SessionError);
    {
        std::ofstream junk(dir_->file("junk.kvlab"));
        junk << "not a session";
    }
    try {
        canvas.open_session(dir_->file("junk.kvlab"));
        FAIL() << "a non-session file must be refused";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("junk.kvlab"), std::string::npos) << e.what();
    }
    canvas.open_session(path_);
    canvas.open_session("");
    EXPECT_TRUE(canvas.session_path().empty());
    EXPECT_TRUE(canvas.selected_runs().empty());
}

TEST(Canvas, FollowsALiveRunAndEndsEqualToAFreshLoad) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("live.kvlab");
    sessions::RunManager rm(path);
    const int64_t run = rm.submit(test::tiny_eval_config("h2o-default", 128, 2048, 2, 16));
    test::RecordingTextureHost host;
    test::ImGuiHarness h;
    Canvas live(&host);
    live.open_session(path);
    live.select_runs({run});
    int refreshes_with_data = 0, frames = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
        const bool running = rm.status(run) == storage::RunStatus::RUNNING || rm.status(run) == storage::RunStatus::QUEUED;
        // Alternate views so each follows the run in slices.
        live.set_view(frames % 2 ? view_named("memory timeline") : view_named("eviction map"));
        refreshes_with_data += live.refresh();
        h.frame([&] { live.draw(1000, 700); });
        ++frames;
        if (!running) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(rm.wait(run), storage::RunStatus::DONE);
    for (ViewKind k : {view_named("eviction map"), view_named("memory timeline")}) {
        live.set_view(k);
        while (live.refresh()) {
        }
    }
    EXPECT_GT(refreshes_with_data, 1);
    Canvas fresh(&host);
    fresh.open_session(path);
    fresh.select_runs({run});
    for (ViewKind k : {view_named("eviction map"), view_named("memory timeline")}) {
        fresh.set_view(k);
        while (fresh.refresh()) {  // reading is budgeted per refresh: slices until caught up
        }
    }
    EXPECT_TRUE(fresh.impl().state<MemoryTimelineViewState>().caught_up);
    const EvictionData &a = live.impl().state<EvictionMapViewState>().data, &b = fresh.impl().state<EvictionMapViewState>().data;
    ASSERT_EQ(a.sequences.size(), b.sequences.size());
    for (size_t q = 0; q < a.sequences.size(); ++q) {
        ASSERT_EQ(a.sequences[q].layers.size(), b.sequences[q].layers.size());
        for (size_t l = 0; l < a.sequences[q].layers.size(); ++l) {
            const auto &x = a.sequences[q].layers[l], &y = b.sequences[q].layers[l];
            ASSERT_EQ(x.steps(), y.steps());
            for (size_t r = 0; r < x.tracks.size(); ++r) EXPECT_EQ(x.tracks[r].evicted_at, y.tracks[r].evicted_at);
        }
    }
    const auto &ma = live.impl().state<MemoryTimelineViewState>(), &mb = fresh.impl().state<MemoryTimelineViewState>();
    EXPECT_EQ(ma.peak_bytes(), mb.peak_bytes());
    EXPECT_EQ(ma.series.at(-1).events, mb.series.at(-1).events);
    EXPECT_EQ(ma.last_span_id, mb.last_span_id);
}

}  // namespace
}  // namespace kv::views
