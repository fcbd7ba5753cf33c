// Memory timeline: the peak shown equals the allocator's running-total peak in the raw events,
// buckets agree with SessionReader::memory_timeline, the block fallback keeps the peak exact,
// budgeted and incremental refreshes equal a full reload, span lanes index correctly, and the
// view draws headless (including zoom to a cell).
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

#include "engine/telemetry/string_table.h"
#include "views/colormap.h"
#include "views/memory_timeline.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

class MemoryRun : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("run.kvlab");
        run_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 64)}).front();
    }
    static void TearDownTestSuite() { delete dir_; }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static int64_t run_;
};
test::ViewsScratchDir* MemoryRun::dir_ = nullptr;
std::string MemoryRun::path_;
int64_t MemoryRun::run_ = 0;

void expect_same_buckets(const std::vector<storage::MemoryBucket>& a, const std::vector<storage::MemoryBucket>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].t0_ns, b[i].t0_ns) << i;
        EXPECT_EQ(a[i].t1_ns, b[i].t1_ns) << i;
        EXPECT_EQ(a[i].events, b[i].events) << i;
        EXPECT_EQ(a[i].total_min, b[i].total_min) << i;
        EXPECT_EQ(a[i].total_max, b[i].total_max) << i;
        EXPECT_EQ(a[i].total_last, b[i].total_last) << i;
        EXPECT_EQ(a[i].at_max, b[i].at_max) << i;
    }
}

TEST_F(MemoryRun, ShownPeakIsTheAllocatorsPeakRunningTotal) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    ASSERT_TRUE(refresh_memory_timeline(s, reader));
    ASSERT_TRUE(s.caught_up);
    int64_t peak = 0;
    for (const auto& e : reader.memory_events(run_)) peak = std::max(peak, e.device_total);
    ASSERT_GT(peak, 0);
    EXPECT_EQ(s.peak_bytes(), peak);
    EXPECT_EQ(s.peak_bytes(-1), peak);
    // The writer's run summary records the same running-total peak.
    const auto summary = nlohmann::json::parse(reader.run(run_).summary);
    EXPECT_EQ(summary.at("peak_bytes").at("cpu").get<int64_t>(), peak);
    // What the view draws for the whole run peaks there too.
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawMemoryTimelineView(s, &host); });
    EXPECT_EQ(s.shown_device, -1);
    EXPECT_EQ(s.shown_peak, peak);
    // The stack at the peak bucket adds up to the device total (categories partition it).
    const auto it = std::max_element(s.shown_buckets.begin(), s.shown_buckets.end(),
                                      [](const auto& a, const auto& b) { return a.total_max < b.total_max; });
    int64_t sum = 0;
    for (int64_t v : it->at_max) sum += v;
    EXPECT_EQ(sum, peak);
    // The plot image shows those buckets: one texture, one column per bucket, uploaded once for
    // two identical frames; its highest painted row is in the peak's column.
    ASSERT_EQ(host.live.size(), 1u);
    const auto& tex = host.live.begin()->second;
    EXPECT_EQ(tex.width, int(s.shown_buckets.size()));
    EXPECT_EQ(tex.uploads, 1);
    EXPECT_EQ(tex.pixels, s.plot_pixels);
    // Rows above the peak's row hold only background (and cell bands) in every column; in the
    // peak's column that row is painted.
    auto at = [&](int x, int y) {
        const uint8_t* p = &tex.pixels[(size_t(y) * size_t(tex.width) + size_t(x)) * 4];
        return pack_rgba(p[0], p[1], p[2], p[3]);
    };
    const double ymax = double(peak) * 1.08;
    const int peak_row = tex.height - 1 - int(std::floor(double(peak) / ymax * tex.height));
    ASSERT_GT(peak_row, 0);
    for (int x = 0; x < tex.width; ++x)
        for (int y = 0; y < peak_row; ++y) ASSERT_EQ(at(x, y), at(x, 0)) << "column " << x << " row " << y << " above the peak";
    bool marked = false;
    for (int x = 0; x < tex.width; ++x)
        if (s.shown_buckets[size_t(x)].total_max == peak && at(x, peak_row) != at(x, 0)) marked = true;
    EXPECT_TRUE(marked) << "the peak's column is painted at the peak's row";
}

TEST_F(MemoryRun, BucketsAgreeWithTheReadersDecimation) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    refresh_memory_timeline(s, reader);
    const MemorySeries& ser = s.series.at(-1);
    ASSERT_TRUE(ser.raw_complete);
    for (int n : {1, 7, 100, 1000}) {
        const auto mine = memory_series_buckets(ser, ser.t_min, ser.t_max + 1, n);
        const auto theirs = reader.memory_timeline(run_, -1, {ser.t_min, ser.t_max + 1}, n);
        expect_same_buckets(mine, theirs);
    }
    // A window in the middle (state carried in from before it).
    const int64_t a = ser.t_min + (ser.t_max - ser.t_min) / 3, b = ser.t_min + (ser.t_max - ser.t_min) / 2;
    expect_same_buckets(memory_series_buckets(ser, a, b, 50), reader.memory_timeline(run_, -1, {a, b}, 50));
}

TEST_F(MemoryRun, BlockFallbackKeepsThePeakAndZoomQueriesTheReader) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    // Force the huge-run path: no raw events kept beyond 64.
    s.series[-1].device = -1;
    s.series[-1].raw_limit = 64;
    refresh_memory_timeline(s, reader);
    const MemorySeries& ser = s.series.at(-1);
    ASSERT_FALSE(ser.raw_complete);
    int64_t peak = 0;
    for (const auto& e : reader.memory_events(run_)) peak = std::max(peak, e.device_total);
    EXPECT_EQ(ser.peak, peak);
    int64_t block_peak = 0, block_events = 0;
    for (const auto& b : ser.blocks) block_peak = std::max(block_peak, b.total_max), block_events += b.events;
    EXPECT_EQ(block_peak, peak);
    EXPECT_EQ(block_events, ser.events);
    const auto whole = memory_series_buckets(ser, ser.t_min, ser.t_max + 1, 20);
    int64_t shown = 0;
    for (const auto& b : whole) shown = std::max(shown, b.total_max);
    EXPECT_EQ(shown, peak);
    // A zoomed window small enough for the reader: exact buckets, merged to the pixel columns.
    s.follow = false;
    s.time = {double(ser.t_min - s.t0_ns), double(ser.t_max + 1 - s.t0_ns)};
    const auto zoomed = memory_view_buckets(s, &reader, 40);
    ASSERT_TRUE(s.zoom_valid) << "the window holds few events: the reader was asked";
    int64_t zpeak = 0;
    for (const auto& b : zoomed) zpeak = std::max(zpeak, b.total_max);
    EXPECT_EQ(zpeak, peak);
    // Exact at every zoom: equal to the reader's own decimation of the window, including a
    // window that starts mid-run (state from the block holding its start).
    const int64_t w0 = s.t0_ns + int64_t(std::floor(s.time.lo)), w1 = s.t0_ns + int64_t(std::ceil(s.time.hi));
    expect_same_buckets(zoomed, reader.memory_timeline(run_, -1, {w0, w1}, 40));
    const double span = s.time.span();
    s.time = {s.time.lo + span * 0.37, s.time.lo + span * 0.41};
    const auto mid = memory_view_buckets(s, &reader, 25);
    const int64_t m0 = s.t0_ns + int64_t(std::floor(s.time.lo)), m1 = s.t0_ns + int64_t(std::ceil(s.time.hi));
    expect_same_buckets(mid, reader.memory_timeline(run_, -1, {m0, m1}, 25));
}

TEST_F(MemoryRun, BudgetedRefreshesCatchUpToTheSameState) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState slow, full;
    full.refresh_budget_ms = test::kWholeRefresh;
    slow.run = full.run = run_;
    slow.rows_per_read = 97;
    slow.refresh_budget_ms = 0;  // one slice per refresh
    int refreshes = 0;
    while (!slow.caught_up && refreshes < 10000) refresh_memory_timeline(slow, reader), ++refreshes;
    EXPECT_GT(refreshes, 5);
    refresh_memory_timeline(full, reader);
    const MemorySeries &a = slow.series.at(-1), &b = full.series.at(-1);
    EXPECT_EQ(a.events, b.events);
    EXPECT_EQ(a.peak, b.peak);
    EXPECT_EQ(a.blocks.size(), b.blocks.size());
    ASSERT_EQ(a.raw.size(), b.raw.size());
    for (size_t i = 0; i < a.raw.size(); ++i) EXPECT_EQ(a.raw[i].id, b.raw[i].id);
    ASSERT_EQ(slow.lanes.size(), full.lanes.size());
    for (size_t l = 0; l < slow.lanes.size(); ++l) {
        ASSERT_EQ(slow.lanes[l].spans.size(), full.lanes[l].spans.size());
        for (size_t i = 0; i < slow.lanes[l].spans.size(); ++i) EXPECT_EQ(slow.lanes[l].spans[i].id, full.lanes[l].spans[i].id);
    }
    EXPECT_EQ(slow.cells.size(), full.cells.size());
}

// The timeline names every phase (issue 37): a "phase" lane holds the run's RUN-category spans
// but the whole-run span, with the phases this run went through, each as the reader stores it.
TEST_F(MemoryRun, ThePhaseLaneHoldsEveryPhaseOfTheRun) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    refresh_memory_timeline(s, reader);
    std::multiset<std::string> stored;
    for (const auto& r : reader.spans(run_))
        if (r.category == trace::SpanCategory::RUN && r.name != "run") stored.insert(r.name);
    for (const char* want : {"load", "data", "policy pass"}) EXPECT_TRUE(stored.count(want)) << want;
    const SpanLane* phases = nullptr;
    for (const auto& l : s.lanes)
        if (l.category == trace::SpanCategory::RUN) phases = &l;
    ASSERT_NE(phases, nullptr) << "no phase lane";
    std::multiset<std::string> shown;
    for (const auto& b : phases->spans) shown.insert(s.span_names[b.name]);
    EXPECT_EQ(shown, stored);
}

// Compare's memory overlay draws a run's own bytes: for a fidelity run its highest column is the
// run's own peak as the session writer summarised it, not the peak with the shadow cache.
TEST(MemoryTimeline, TheOverlayOfAFidelityRunLeavesInstrumentationOut) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("fid.kvlab");
    RunConfig cfg = test::tiny_eval_config("h2o-default", 64);
    cfg.fidelity = true;
    const int64_t run = test::record_tiny_runs(path, {cfg}).front();
    storage::SessionReader reader(path);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run;
    refresh_memory_timeline(s, reader);
    const MemorySeries& ser = s.series.at(-1);
    const nlohmann::json sum = nlohmann::json::parse(reader.run(run).summary);
    const int64_t own = sum.at("peak_bytes_without_instrumentation").at("cpu").get<int64_t>();
    EXPECT_EQ(ser.own_peak, own);
    EXPECT_GT(ser.peak, own) << "the shadow cache is in the total";
    // One chunk spanning every event: its column is the run's own peak.
    std::vector<ProgressKnot> knots(2);
    knots[0].t_ns = ser.t_min, knots[0].x = 0;
    knots[1].t_ns = ser.t_max, knots[1].x = 1;
    const std::vector<double> col = memory_over_progress(ser, knots, 1, 1);
    ASSERT_EQ(col.size(), 1u);
    EXPECT_DOUBLE_EQ(col[0], double(own));
}

TEST(MemoryTimeline, IncrementalRefreshWhileARunWritesEqualsFullReload) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("mem.kvlab"));
    storage::SessionReader reader(run.path());
    MemoryTimelineViewState live;
    live.refresh_budget_ms = test::kWholeRefresh;
    live.run = run.run();
    std::array<int64_t, kNumMemCategories> cat{};
    int64_t total = 0;
    auto phase = [&](int begin, int end) {
        for (int i = begin; i < end; ++i) {
            // A pyramid: allocate for 3 of every 4 events, then free; five categories.
            const MemCategory c = MemCategory(i % 5);
            const int64_t bytes = (i % 4 == 3 && cat[size_t(c)] >= 4096) ? -4096 : 4096 + 512 * (i % 7);
            cat[size_t(c)] += bytes;
            total += bytes;
            trace::Event ev;
            ev.alloc = trace::AllocRecord{};
            ev.alloc.type = trace::EventType::ALLOC;
            ev.alloc.category = c;
            ev.alloc.device = -1;
            ev.alloc.label_id = trace::intern("buffer " + std::to_string(i % 3));
            ev.alloc.t_ns = uint64_t(run.t0() + 1000 * i);
            ev.alloc.bytes = bytes;
            ev.alloc.alloc_id = uint64_t(i + 1);
            ev.alloc.category_total = cat[size_t(c)];
            ev.alloc.device_total = total;
            ev.alloc.layer = ev.alloc.chunk = -1;
            run.push(ev);
        }
        run.produce([&] {
            for (int i = begin; i < end; ++i)
                trace::span_complete(trace::SpanCategory(4 + i % 3), trace::Name("op"), uint64_t(run.t0() + 1000 * i),
                                     uint64_t(run.t0() + 1000 * i + 700), {.layer = i % 4, .chunk = i / 4});
        });
        run.flush();
        refresh_memory_timeline(live, reader);
    };
    phase(0, 50);
    const int64_t mid_events = live.series.count(-1) ? live.series.at(-1).events : 0;
    phase(50, 120);
    phase(120, 200);
    run.finish();
    refresh_memory_timeline(live, reader);
    MemoryTimelineViewState fresh;
    fresh.refresh_budget_ms = test::kWholeRefresh;
    fresh.run = run.run();
    refresh_memory_timeline(fresh, reader);
    ASSERT_EQ(live.series.size(), fresh.series.size());
    const MemorySeries &a = live.series.at(-1), &b = fresh.series.at(-1);
    EXPECT_GT(a.events, mid_events);
    EXPECT_EQ(a.events, b.events);
    EXPECT_EQ(a.peak, b.peak);
    EXPECT_EQ(a.at_peak, b.at_peak);
    expect_same_buckets(memory_series_buckets(a, a.t_min, a.t_max + 1, 64), memory_series_buckets(b, b.t_min, b.t_max + 1, 64));
    ASSERT_EQ(live.lanes.size(), fresh.lanes.size());
    for (size_t l = 0; l < live.lanes.size(); ++l) EXPECT_EQ(live.lanes[l].spans.size(), fresh.lanes[l].spans.size());
    int64_t spans = 0;
    for (const auto& l : fresh.lanes) spans += int64_t(l.spans.size());
    EXPECT_EQ(spans, 200);
}

TEST(MemoryTimeline, LaneOverlapRangeCoversEveryOverlappingSpan) {
    SpanLane lane;
    // Out-of-order arrivals (spans end in a different order than they start).
    const int64_t starts[] = {0, 50, 10, 200, 120, 400, 90};
    const int64_t ends[] = {40, 300, 20, 210, 130, 900, 95};
    for (int i = 0; i < 7; ++i) lane.add({starts[i], ends[i], i + 1, 0, -1, -1, 0});
    for (size_t i = 1; i < lane.spans.size(); ++i) EXPECT_LE(lane.spans[i - 1].start_ns, lane.spans[i].start_ns);
    for (int64_t t0 = -10; t0 < 950; t0 += 7)
        for (int64_t w : {1, 5, 60, 500}) {
            const auto [lo, hi] = lane.overlapping(t0, t0 + w);
            for (size_t i = 0; i < lane.spans.size(); ++i) {
                const bool overlaps = lane.spans[i].end_ns > t0 && lane.spans[i].start_ns < t0 + w;
                if (overlaps) {
                    EXPECT_TRUE(i >= lo && i < hi) << t0 << "+" << w << " span " << i;
                }
            }
        }
    // 600 spans: blocks of 256 carry the extents of their spans.
    SpanLane big;
    for (int i = 0; i < 600; ++i) big.add({i * 10, i * 10 + 5 + (i == 3 ? 5000 : 0), i, 0, -1, -1, 0});
    ASSERT_EQ(big.blocks.size(), 3u);
    EXPECT_EQ(big.blocks[0].first, 0);
    EXPECT_EQ(big.blocks[0].second, 30 + 5 + 5000);
    EXPECT_EQ(big.blocks[2].second, 5995);
}

TEST_F(MemoryRun, DrawsLanesAndCellBandsAndZoomsToACell) {
    storage::SessionReader reader(path_);
    MemoryTimelineViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    refresh_memory_timeline(s, reader);
    ASSERT_FALSE(s.cells.empty()) << "the forward pass records its cells as spans";
    ASSERT_FALSE(s.lanes.empty());
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawMemoryTimelineView(s, &host); }, ImVec2(600, 200));
    EXPECT_GT(vtx, 1000);
    EXPECT_EQ(host.live.size(), 1u) << "the plot is one texture";
    EXPECT_GE(s.hover_t0, 0) << "hovering the plot looked up the allocations under the cursor";
    EXPECT_TRUE(memory_timeline_has_requests(s)) << "draw never queries: it asked for them";
    EXPECT_TRUE(serve_memory_timeline_requests(s, reader));
    EXPECT_TRUE(s.hover_loaded);
    EXPECT_FALSE(memory_timeline_has_requests(s));
    zoom_to_cell(s, 1);
    EXPECT_FALSE(s.follow);
    EXPECT_LE(s.time.lo, double(s.cells[1].start_ns - s.t0_ns));
    EXPECT_GE(s.time.hi, double(s.cells[1].end_ns - s.t0_ns));
    EXPECT_LT(s.time.span(), 1.2 * double(s.cells[1].end_ns - s.cells[1].start_ns));
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawMemoryTimelineView(s, &host); });
    EXPECT_EQ(host.live.size(), 1u) << "zooming replaces the plot texture rather than adding one";
    release_memory_timeline_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
    int64_t events = 0;
    for (const auto& b : s.shown_buckets) events += b.events;
    int64_t in_cell = 0;
    for (const auto& e : reader.memory_events(run_))
        if (double(e.t_ns - s.t0_ns) >= std::floor(s.time.lo) && double(e.t_ns - s.t0_ns) < std::ceil(s.time.hi)) ++in_cell;
    EXPECT_EQ(events, in_cell) << "the zoomed buckets hold exactly the events of the window";
}

}  // namespace
}  // namespace kv::views
