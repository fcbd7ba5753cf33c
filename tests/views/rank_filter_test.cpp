// Data-parallel runs in one session (issue 23): a rank's run imported from its own session file
// holds the same spans, memory events, metrics and memory blocks as the file it came from
// (checked against a reader on that file); rank_runs() maps the run to its ranks; the memory
// timeline shows a rank selector only for a run with more than one rank, and picking rank 1
// shows rank 1's memory (its raw events: count and peak) and spans, picking rank 0 again rank 0's.
#include <gtest/gtest.h>

#include <algorithm>

#include "storage/rank_runs.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "views/memory_timeline.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

int64_t shown_events(const MemoryTimelineViewState& s) {
    int64_t n = 0;
    for (const auto& [dev, ser] : s.series) n += ser.events;
    return n;
}

int64_t raw_peak(storage::SessionReader& r, int64_t run) {
    int64_t peak = 0;
    for (const auto& e : r.memory_events(run)) peak = std::max(peak, e.device_total);
    return peak;
}

class RankRuns : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        main_ = dir_->file("main.kvlab");
        rank1_ = dir_->file("rank1.kvlab");
        // Two different runs, so "rank 1's data" cannot be mistaken for rank 0's: a longer
        // sequence and a larger cache give rank 1 more events and a higher peak.
        run0_ = test::record_tiny_runs(main_, {test::tiny_eval_config("h2o-default", 64, 256)}).front();
        src_run_ = test::record_tiny_runs(rank1_, {test::tiny_eval_config("lastrec-default", 128, 512)}).front();
        // A one-process run in the same session (no selector for it).
        single_ = test::record_tiny_runs(main_, {test::tiny_eval_config("lastrec-default", 64, 256)}).front();
        imported_ = storage::import_rank_run(main_, run0_, 1, rank1_, src_run_);
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string main_, rank1_;
    static int64_t run0_, src_run_, single_;
    static storage::RankImport imported_;
};
test::ViewsScratchDir* RankRuns::dir_ = nullptr;
std::string RankRuns::main_, RankRuns::rank1_;
int64_t RankRuns::run0_ = 0, RankRuns::src_run_ = 0, RankRuns::single_ = 0;
storage::RankImport RankRuns::imported_;

TEST_F(RankRuns, ImportHoldsTheRanksOwnRecords) {
    storage::SessionReader dst(main_), src(rank1_);
    const int64_t r1 = imported_.run;
    ASSERT_GT(r1, single_);
    // Every span, with its name (strings are re-interned in the target), category and times.
    const auto a = src.spans(src_run_), b = dst.spans(r1);
    ASSERT_GT(a.size(), 0u);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(imported_.spans, int64_t(a.size()));
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].name, b[i].name) << i;
        EXPECT_EQ(a[i].start_ns, b[i].start_ns) << i;
        EXPECT_EQ(a[i].end_ns, b[i].end_ns) << i;
        EXPECT_EQ(a[i].category, b[i].category) << i;
    }
    // Every memory event, in order, with its label and running totals.
    const auto ma = src.memory_events(src_run_), mb = dst.memory_events(r1);
    ASSERT_GT(ma.size(), 0u);
    ASSERT_EQ(ma.size(), mb.size());
    EXPECT_EQ(imported_.memory_events, int64_t(ma.size()));
    for (size_t i = 0; i < ma.size(); ++i) {
        EXPECT_EQ(ma[i].label, mb[i].label) << i;
        EXPECT_EQ(ma[i].bytes, mb[i].bytes) << i;
        EXPECT_EQ(ma[i].t_ns, mb[i].t_ns) << i;
        EXPECT_EQ(ma[i].device_total, mb[i].device_total) << i;
        EXPECT_EQ(ma[i].category_total, mb[i].category_total) << i;
    }
    // The block index moved with the ids: windowed bucket queries (which start from a block's
    // state) give what the source gives.
    const int64_t t0 = ma.front().t_ns, t1 = ma.back().t_ns + 1;
    const auto qa = src.memory_timeline(src_run_, -1, {t0, t1}, 37), qb = dst.memory_timeline(r1, -1, {t0, t1}, 37);
    ASSERT_EQ(qa.size(), qb.size());
    for (size_t i = 0; i < qa.size(); ++i) {
        EXPECT_EQ(qa[i].total_max, qb[i].total_max) << i;
        EXPECT_EQ(qa[i].events, qb[i].events) << i;
    }
    EXPECT_EQ(src.metrics(src_run_).size(), dst.metrics(r1).size());
    // The runs table: the rank run names its rank and run, and is final.
    const storage::RunInfo info = dst.run(r1);
    EXPECT_EQ(storage::run_rank(info), 1);
    EXPECT_EQ(storage::rank_run_parent(info), run0_);
    EXPECT_TRUE(storage::is_rank_run(info));
    EXPECT_EQ(info.status, storage::RunStatus::DONE);
    EXPECT_FALSE(storage::is_rank_run(dst.run(run0_)));
    EXPECT_EQ(storage::rank_runs(dst.runs(), run0_), (std::vector<int64_t>{run0_, r1}));
    EXPECT_EQ(storage::rank_runs(dst.runs(), single_), (std::vector<int64_t>{single_}));
}

TEST_F(RankRuns, ImportOfARunThatNeverFinishedIsCrashed) {
    // A rank that died leaves its run `running` in its file; imported, it says so.
    const std::string dead = dir_->file("dead.kvlab");
    {
        auto s = storage::Session::create(dead);
        const int64_t r = s->create_run("dead rank", R"({"mode":"finetune_long_lora"})");
        s->start_run(r);
    }
    storage::SessionReader probe(dead);
    const int64_t src = probe.runs().front().id;
    const int64_t parent = storage::Session::open(main_)->create_run("parent", R"({"mode":"finetune_long_lora"})");
    const storage::RankImport imp = storage::import_rank_run(main_, parent, 2, dead, src);
    storage::SessionReader dst(main_);
    const storage::RunInfo info = dst.run(imp.run);
    EXPECT_EQ(info.status, storage::RunStatus::CRASHED);
    EXPECT_NE(info.error.find("rank 2 stopped before its run finished"), std::string::npos) << info.error;
    // Ranks without telemetry are holes (0), so the selector still has every rank.
    EXPECT_EQ(storage::rank_runs(dst.runs(), parent), (std::vector<int64_t>{parent, 0, imp.run}));
}

TEST_F(RankRuns, ImportOfAMissingFileFailsNamingIt) {
    try {
        storage::import_rank_run(main_, run0_, 3, dir_->file("absent.kvlab"), 1);
        FAIL() << "no error";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("absent.kvlab"), std::string::npos) << e.what();
    }
}

TEST_F(RankRuns, MemoryTimelineFiltersByRank) {
    storage::SessionReader reader(main_), src(rank1_);
    test::ImGuiHarness h;
    test::RecordingTextureHost host;

    // A one-process run: no selector.
    MemoryTimelineViewState one;
    one.refresh_budget_ms = test::kWholeRefresh;
    one.run = single_;
    ASSERT_TRUE(refresh_memory_timeline(one, reader));
    EXPECT_EQ(one.rank_runs.size(), 1u);
    h.window_frame([&] { DrawMemoryTimelineView(one, &host); });
    EXPECT_FALSE(one.shown_rank_selector);

    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run0_;
    ASSERT_TRUE(refresh_memory_timeline(s, reader));
    while (!s.caught_up) refresh_memory_timeline(s, reader);
    ASSERT_EQ(s.rank_runs, (std::vector<int64_t>{run0_, imported_.run}));
    h.window_frame([&] { DrawMemoryTimelineView(s, &host); });
    EXPECT_TRUE(s.shown_rank_selector);
    const int64_t peak0 = raw_peak(reader, run0_), peak1 = raw_peak(src, src_run_);
    const int64_t events0 = int64_t(reader.memory_events(run0_).size()), events1 = int64_t(src.memory_events(src_run_).size());
    ASSERT_NE(events0, events1);  // the two ranks are told apart by their events (a longer sequence)
    EXPECT_EQ(shown_events(s), events0);
    EXPECT_EQ(s.peak_bytes(), peak0);

    // Rank 1: the view asks for a reload, and then shows rank 1's memory and spans.
    EXPECT_FALSE(select_memory_rank(s, 2, &host));  // no such rank
    const uint64_t texture0 = s.plot_texture;
    ASSERT_NE(texture0, 0u);
    ASSERT_TRUE(select_memory_rank(s, 1, &host));
    EXPECT_EQ(s.rank, 1);
    EXPECT_EQ(s.run, imported_.run);
    EXPECT_EQ(host.live.count(texture0), 0u);  // rank 0's plot texture went back
    EXPECT_TRUE(memory_timeline_has_requests(s));
    ASSERT_TRUE(serve_memory_timeline_requests(s, reader));
    while (!s.caught_up) refresh_memory_timeline(s, reader);
    EXPECT_EQ(shown_events(s), events1);
    EXPECT_EQ(s.peak_bytes(), peak1);
    size_t spans = 0;
    for (const auto& lane : s.lanes) spans += lane.spans.size();
    size_t src_spans = 0;  // lanes hold op spans and phases (cells are bands, the run span is the axis)
    for (const auto& sp : src.spans(src_run_))
        src_spans += !(sp.category == trace::SpanCategory::RUN && sp.name == "run") && sp.category != trace::SpanCategory::CELL;
    ASSERT_GT(src_spans, 0u);
    EXPECT_EQ(spans, src_spans);
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawMemoryTimelineView(s, &host); });
    EXPECT_TRUE(s.shown_rank_selector);
    EXPECT_EQ(s.shown_peak, peak1);

    // And back.
    ASSERT_TRUE(select_memory_rank(s, 0, &host));
    ASSERT_TRUE(serve_memory_timeline_requests(s, reader));
    while (!s.caught_up) refresh_memory_timeline(s, reader);
    EXPECT_EQ(s.run, run0_);
    EXPECT_EQ(shown_events(s), events0);
    EXPECT_EQ(s.peak_bytes(), peak0);
    release_memory_timeline_textures(s, &host);
    release_memory_timeline_textures(one, &host);
}

}  // namespace
}  // namespace kv::views
