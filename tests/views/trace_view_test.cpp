// Trace view: its model against references computed another way. On random span trees: rows
// and parents against a brute-force innermost-containing-span search; every level of detail
// covers exactly the spans of its row; range summaries equal storage::span_summary over the
// same rows (itself checked against brute force in tests/storage); the icicle's totals and
// self times per (name, category) equal the summary's, and its layout widths equal the totals
// at the drawn scale; unattributed time equals the run span minus its children's time; the
// search histogram counts every matching span once, and its statistics and bars (what a click
// selects) equal a brute-force recomputation. Then the view on a synthetic session.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <cstdint>
#include <unordered_map>
#include <random>

#include "engine/telemetry/gpu_records.h"
#include "storage/span_summary.h"
#include "views/trace_model.h"
#include "views/trace_view.h"
#include "views/view_table.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

using trace::SpanCategory;

struct Gen {
    std::mt19937_64 rng;
    std::vector<TraceSpan> spans;
    std::vector<std::string> names{"run", "load", "policy pass", "cell", "layer", "chunk", "attention", "mlp", "sdpa", "rmsnorm"};
    int64_t next_id = 1;
    // Children written before their parent (as scopes close): the later id is the outer span.
    void tree(int32_t thread, int64_t b, int64_t e, int depth, uint32_t name, SpanCategory cat) {
        std::uniform_int_distribution<int> kids(0, depth > 4 ? 0 : 4), coin(0, 9), pick(1, int(names.size()) - 1);
        int64_t at = b;
        for (int k = 0, n = kids(rng); k < n && at < e; ++k) {
            std::uniform_int_distribution<int64_t> len(0, std::max<int64_t>(0, (e - at) / 2));
            int64_t cb = coin(rng) < 3 ? at : at + len(rng) / 2, ce = std::min(e, cb + len(rng));
            if (coin(rng) == 9 && k == 0) cb = b, ce = e;
            if (cb > e) break;
            const int p = pick(rng);
            const SpanCategory c = p <= 2 ? SpanCategory::RUN : p == 3 ? SpanCategory::CELL : p == 4 ? SpanCategory::LAYER
                                   : p == 5                  ? SpanCategory::CHUNK
                                   : p <= 8                  ? SpanCategory::ATTENTION
                                                             : SpanCategory::NORM;
            tree(thread, cb, ce, depth + 1, uint32_t(p), c);
            at = ce;
        }
        std::uniform_int_distribution<int32_t> layer(-1, 3);
        spans.push_back({b, e, name, cat, thread, layer(rng), -1, next_id++, 0});
    }
};

TraceModel random_model(uint64_t seed, Gen* out = nullptr) {
    Gen g;
    g.rng.seed(seed);
    g.tree(0, 1'000'000, 9'000'000, 0, 0, SpanCategory::RUN);  // thread 0: the run
    for (int32_t t = 1; t <= 2; ++t)
        for (int r = 0; r < 3; ++r) g.tree(t, 1'000'000 + r * 2'500'000, 1'000'000 + r * 2'500'000 + 2'000'000, 2, 5, SpanCategory::CHUNK);
    if (out) *out = g;
    return build_trace_model(g.spans, g.names);
}

// Innermost span on the same thread containing span c (of identical intervals the later id
// is outer), by scanning all spans.
long brute_parent(const std::vector<TraceSpan>& s, size_t c) {
    long best = -1;
    for (size_t p = 0; p < s.size(); ++p) {
        if (p == c || s[p].thread != s[c].thread || s[p].start_ns > s[c].start_ns || s[p].end_ns < s[c].end_ns) continue;
        if (s[p].start_ns == s[c].start_ns && s[p].end_ns == s[c].end_ns && s[p].id < s[c].id) continue;
        const auto d = [&](size_t i) { return s[i].end_ns - s[i].start_ns; };
        if (best < 0 || d(p) < d(size_t(best)) || (d(p) == d(size_t(best)) && s[p].id < s[size_t(best)].id)) best = long(p);
    }
    return best;
}

TEST(TraceModel, RowsAndParentsMatchABruteForceContainmentSearch) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
        const TraceModel m = random_model(seed);
        ASSERT_GT(m.spans.size(), 20u);
        std::vector<int> depth(m.spans.size(), -1);
        for (const TraceLane& lane : m.lanes)
            for (size_t d = 0; d < lane.rows.size(); ++d)
                for (size_t k = 0; k < lane.rows[d].spans.size(); ++k) {
                    const uint32_t i = lane.rows[d].spans[k];
                    EXPECT_EQ(m.spans[i].thread, lane.thread);
                    depth[i] = int(d);
                    if (k > 0) {  // disjoint, in order
                        EXPECT_LE(m.spans[lane.rows[d].spans[k - 1]].end_ns, m.spans[i].start_ns);
                    }
                }
        for (size_t i = 0; i < m.spans.size(); ++i) {
            const long p = brute_parent(m.spans, i);
            EXPECT_EQ(m.parent[i], p < 0 ? kNoParent : uint32_t(p)) << "span " << i;
            int ancestors = 0;
            for (long q = p; q >= 0; q = brute_parent(m.spans, size_t(q))) ++ancestors;
            EXPECT_EQ(depth[i], ancestors) << "span " << i;
        }
    }
}

TEST(TraceModel, EveryLevelOfDetailCoversExactlyItsRowsSpans) {
    const TraceModel m = random_model(7);
    for (const TraceLane& lane : m.lanes)
        for (const TraceRow& row : lane.rows)
            for (size_t k = 0; k < row.levels.size(); ++k) {
                const auto& lv = row.levels[k];
                uint64_t count = 0;
                for (size_t b = 0; b < lv.size(); ++b) {
                    count += lv[b].count;
                    if (b > 0) {
                        EXPECT_GE(lv[b].start_ns - lv[b - 1].end_ns, lod_gap_ns(k)) << "level " << k << " left a small gap";
                    }
                }
                EXPECT_EQ(count, row.spans.size());
                for (uint32_t i : row.spans) {  // each span inside one box
                    const auto [lo, hi] = merged_window(lv, m.spans[i].start_ns, m.spans[i].end_ns + 1);
                    ASSERT_GE(hi, lo + 1);
                    EXPECT_LE(lv[lo].start_ns, m.spans[i].start_ns);
                    EXPECT_GE(lv[lo].end_ns, m.spans[i].end_ns);
                }
            }
    EXPECT_EQ(pick_lod_level(10.0), -1);
    EXPECT_EQ(pick_lod_level(1000.0), 0);
    EXPECT_EQ(pick_lod_level(5000.0), 1);
}

void expect_same(const std::vector<storage::SpanStats>& a, const std::vector<storage::SpanStats>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    std::map<std::tuple<std::string, int, int>, const storage::SpanStats*> by;
    for (const auto& g : b) by[{g.name, int(g.category), g.layer}] = &g;
    for (const auto& g : a) {
        const auto it = by.find({g.name, int(g.category), g.layer});
        ASSERT_NE(it, by.end()) << what << ": " << g.name;
        EXPECT_EQ(g.count, it->second->count) << what << ": " << g.name;
        EXPECT_EQ(g.total_ns, it->second->total_ns) << what << ": " << g.name;
        EXPECT_EQ(g.self_ns, it->second->self_ns) << what << ": " << g.name;
        EXPECT_EQ(g.min_ns, it->second->min_ns) << what << ": " << g.name;
        EXPECT_EQ(g.max_ns, it->second->max_ns) << what << ": " << g.name;
    }
}

TEST(TraceModel, RangeSummariesEqualTheStorageSummary) {
    std::mt19937_64 rng(3);
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        const TraceModel m = random_model(seed);
        const auto rows = trace_span_rows(m);
        std::vector<std::pair<int64_t, int64_t>> windows = {{m.t_min, m.t_max + 1}};
        std::uniform_int_distribution<int64_t> t(m.t_min - 100, m.t_max + 100);
        for (int k = 0; k < 6; ++k) {
            int64_t a = t(rng), b = t(rng);
            windows.push_back({std::min(a, b), std::max(a, b) + 1});
        }
        for (const auto& [a, b] : windows) {
            SCOPED_TRACE("window " + std::to_string(a) + ".." + std::to_string(b));
            const storage::SpanSummary want = storage::span_summary(rows, storage::TimeWindow{a, b});
            const storage::SpanSummary got = trace_range_summary(m, a, b);
            expect_same(got.spans, want.spans, "spans");
            expect_same(got.categories, want.categories, "categories");
            expect_same(got.layers, want.layers, "layers");
            expect_same(got.phases, want.phases, "phases");
            EXPECT_EQ(got.run_ns, want.run_ns);
            EXPECT_EQ(got.unattributed_ns, want.unattributed_ns);
        }
    }
}

TEST(TraceModel, IcicleWidthsEqualTheSummaryTotals) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        const TraceModel m = random_model(seed);
        const storage::SpanSummary sum = storage::span_summary(trace_span_rows(m));
        Icicle ic = build_icicle(m);
        std::map<std::pair<std::string, int>, std::pair<int64_t, int64_t>> by_key;  // total, self
        int64_t roots = 0;
        for (size_t i = 1; i < ic.nodes.size(); ++i) {
            auto& v = by_key[{m.names[ic.nodes[i].name], int(ic.nodes[i].category)}];
            v.first += ic.nodes[i].total_ns;
            v.second += ic.nodes[i].self_ns;
            if (ic.nodes[i].parent == 0) roots += ic.nodes[i].total_ns;
        }
        ASSERT_EQ(by_key.size(), sum.spans.size());
        for (const auto& g : sum.spans) {
            EXPECT_EQ(by_key.at({g.name, int(g.category)}).first, g.total_ns) << g.name;
            EXPECT_EQ(by_key.at({g.name, int(g.category)}).second, g.self_ns) << g.name;
        }
        EXPECT_EQ(ic.nodes[0].total_ns, roots);
        const double W = 1000.0;
        layout_icicle(ic, W);
        const double scale = W / double(ic.nodes[0].total_ns);
        for (size_t i = 1; i < ic.nodes.size(); ++i) {
            const IcicleNode& n = ic.nodes[i];
            EXPECT_NEAR(n.x1 - n.x0, double(n.total_ns) * scale, 1e-6) << i;
            const IcicleNode& p = ic.nodes[size_t(n.parent)];
            EXPECT_GE(n.x0, p.x0 - 1e-6);
            EXPECT_LE(n.x1, p.x1 + 1e-6);
        }
    }
}

TEST(TraceModel, UnattributedTimeIsTheRunMinusItsChildren) {
    Gen g;
    const TraceModel m = random_model(9, &g);
    for (const TraceLane& lane : m.lanes) {
        int64_t want = 0;
        for (size_t i = 0; i < m.spans.size(); ++i) {
            if (m.spans[i].thread != lane.thread || m.parent[i] != kNoParent || m.spans[i].category != SpanCategory::RUN) continue;
            want += m.spans[i].end_ns - m.spans[i].start_ns;
            for (size_t c = 0; c < m.spans.size(); ++c)
                if (m.parent[c] == i) want -= m.spans[c].end_ns - m.spans[c].start_ns;
        }
        int64_t got = 0;
        for (const auto& u : lane.unattributed) got += u.end_ns - u.start_ns;
        EXPECT_EQ(got, want) << "thread " << lane.thread;
        if (lane.thread == 0) {
            EXPECT_GT(want, 0);
        }
    }
}

TEST(TraceModel, SearchCountsEveryMatchOnce) {
    const TraceModel m = random_model(4);
    for (const char* needle : {"att", "ATTENTION", "n", "zzz"}) {
        const SpanSearch f = search_spans(m, needle, 10);
        std::string lower = needle;
        for (char& c : lower) c = char(std::tolower((unsigned char)c));
        int64_t want = 0, total = 0;
        for (const auto& s : m.spans)
            if (m.names[s.name].find(lower) != std::string::npos) ++want, total += s.end_ns - s.start_ns;
        EXPECT_EQ(f.count, want) << needle;
        EXPECT_EQ(f.total_ns, total) << needle;
        int64_t binned = 0;
        for (int64_t b : f.bins) binned += b;
        EXPECT_EQ(binned, want) << needle;
        for (size_t k = 1; k < f.matches.size(); ++k) {
            const auto& a = m.spans[f.matches[k - 1]];
            const auto& b = m.spans[f.matches[k]];
            EXPECT_GE(a.end_ns - a.start_ns, b.end_ns - b.start_ns);
        }
    }
}

// Find Zone's numbers by brute force over the raw spans: count, total, min, max, the
// nearest-rank median and p95 (sorted durations, d[ceil(q n) - 1]); each histogram bar's spans
// (what a click selects) lie between the bar's edges, and the bars together hold every match once.
TEST(TraceModel, SearchStatisticsAndHistogramBarsMatchBruteForce) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        Gen g;
        const TraceModel m = random_model(seed, &g);
        for (const char* needle : {"a", "ATT", "n", "layer"}) {
            SCOPED_TRACE(std::string("seed ") + std::to_string(seed) + " needle " + needle);
            std::string lower = needle;
            for (char& c : lower) c = char(std::tolower((unsigned char)c));
            std::vector<int64_t> d;
            std::multiset<std::pair<int64_t, int64_t>> want;  // (start, end) of every match
            for (const TraceSpan& x : g.spans)
                if (g.names[x.name].find(lower) != std::string::npos) d.push_back(x.end_ns - x.start_ns), want.insert({x.start_ns, x.end_ns});
            ASSERT_FALSE(d.empty());
            std::sort(d.begin(), d.end());
            const int64_t n = int64_t(d.size());
            const SpanSearch f = search_spans(m, needle, 12);
            EXPECT_EQ(f.count, n);
            EXPECT_EQ(f.min_ns, d.front());
            EXPECT_EQ(f.max_ns, d.back());
            EXPECT_EQ(f.total_ns, std::accumulate(d.begin(), d.end(), int64_t(0)));
            EXPECT_EQ(f.median_ns, d[size_t((n + 1) / 2 - 1)]);
            EXPECT_EQ(f.p95_ns, d[size_t((95 * n + 99) / 100 - 1)]);
            std::multiset<std::pair<int64_t, int64_t>> got;
            for (int b = 0; b < int(f.bins.size()); ++b) {
                const std::vector<uint32_t> bar = search_bin_spans(m, f, b, SIZE_MAX);
                EXPECT_EQ(int64_t(bar.size()), f.bins[size_t(b)]) << "bar " << b;
                for (uint32_t i : bar) {
                    const TraceSpan& x = m.spans[i];
                    const double dur = double(std::max<int64_t>(1, x.end_ns - x.start_ns));  // the histogram starts at 1 ns
                    EXPECT_GE(dur, f.bin_edges[size_t(b)] * (1 - 1e-9)) << "bar " << b;
                    EXPECT_LE(dur, f.bin_edges[size_t(b) + 1] * (1 + 1e-9)) << "bar " << b;
                    got.insert({x.start_ns, x.end_ns});
                }
                for (size_t k = 1; k < bar.size(); ++k)
                    EXPECT_GE(m.spans[bar[k - 1]].end_ns - m.spans[bar[k - 1]].start_ns, m.spans[bar[k]].end_ns - m.spans[bar[k]].start_ns);
            }
            EXPECT_EQ(got, want);
            // A click on a bar lists its spans; a search with no match has no bars to click.
            TraceViewState s;
            set_trace_model(s, build_trace_model(g.spans, g.names));
            s.search = search_spans(s.model, needle, 12);
            const int busiest = int(std::max_element(s.search.bins.begin(), s.search.bins.end()) - s.search.bins.begin());
            select_search_bin(s, busiest);
            EXPECT_EQ(int64_t(s.search_bin_matches.size()), std::min<int64_t>(1000, s.search.bins[size_t(busiest)]));
            s.search = search_spans(s.model, "zzz", 12);
            select_search_bin(s, 0);
            EXPECT_EQ(s.search_bin, -1);
            EXPECT_TRUE(s.search_bin_matches.empty());
        }
    }
}

// The view on a synthetic session written through the recorder: it reads every span, its
// whole-run summary equals the storage summary of the reader's rows, and it draws.
TEST(TraceView, RefreshesFromASessionAndDraws) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("trace.kvlab");
    int64_t run = 0;
    {
        auto session = storage::Session::create(path);
        run = session->create_run("trace", R"({"mode":"eval_long"})");
        session->start_run(run);
        trace::Recorder rec;
        {
            storage::SessionWriter writer(path);
            writer.attach(run, rec);
            trace::RecorderScope scope(rec);
            Gen g;
            g.rng.seed(11);
            g.tree(0, 1'000'000, 5'000'000, 0, 0, SpanCategory::RUN);
            for (const TraceSpan& s : g.spans)
                trace::span_complete(s.category, trace::Name(g.names[s.name].c_str()), uint64_t(s.start_ns), uint64_t(s.end_ns),
                                     {.layer = s.layer});
            writer.detach(run);
        }
        session->finish_run(run, storage::RunStatus::DONE);
    }
    storage::SessionReader reader(path);
    TraceViewState s;
    s.run = run;
    EXPECT_TRUE(refresh_trace_view(s, reader));
    const auto rows = reader.spans(run);
    EXPECT_EQ(s.model.spans.size(), rows.size());
    expect_same(s.whole.spans, storage::span_summary(rows).spans, "whole run");
    EXPECT_TRUE(s.caught_up);
    EXPECT_FALSE(refresh_trace_view(s, reader));  // nothing new
    // With no time to read, refresh reads one page at a time and says more waits; the model
    // comes once it has caught up and equals the one read at once.
    TraceViewState slow;
    slow.run = run;
    slow.refresh_budget_ms = 0;
    int refreshes = 0;
    while (refresh_trace_view(slow, reader) && !slow.caught_up && refreshes < 1000) ++refreshes;
    EXPECT_TRUE(slow.caught_up);
    EXPECT_EQ(slow.model.spans.size(), s.model.spans.size());
    test::ImGuiHarness h(1200, 700);
    for (TracePanel p : {TracePanel::RANGE, TracePanel::SEARCH, TracePanel::ICICLE}) {
        s.panel = p;
        std::snprintf(s.search_text, sizeof s.search_text, "att");
        s.search = search_spans(s.model, "att");
        select_trace_range(s, s.model.t_min + 100'000, s.model.t_min + 2'000'000);
        const int vertices = h.window_frame([&] { DrawTraceView(s, nullptr, ImVec2(1200, 700)); }, ImVec2(600, 120));
        EXPECT_GT(vertices, 100);
    }
    // Zoomed in far enough that spans are drawn one by one, and zoomed out to the whole run.
    s.follow = false;
    s.time = {0, 5000};
    EXPECT_GT(h.window_frame([&] { DrawTraceView(s, nullptr, ImVec2(1200, 700)); }, ImVec2(600, 120)), 0);
    // Many threads: more rows than the frame holds; scrolled to the bottom, the last lane's rows draw.
    {
        std::vector<TraceSpan> many;
        for (int32_t t = 0; t < 40; ++t)
            for (int d = 0; d < 4; ++d) many.push_back({1000 + d * 10, 100000 - d * 10, uint32_t(d), SpanCategory::CHUNK, t, -1, -1, t * 10 + 4 - d, 0});
        TraceViewState tall;
        tall.run = 1;
        set_trace_model(tall, build_trace_model(many, {"a", "b", "c", "d"}));
        ASSERT_EQ(tall.model.lanes.size(), 40u);
        const int top = h.window_frame([&] { DrawTraceView(tall, nullptr, ImVec2(1200, 700)); });
        tall.scroll_y = 1e6f;  // clamped to the overflow
        const int bottom = h.window_frame([&] { DrawTraceView(tall, nullptr, ImVec2(1200, 700)); });
        EXPECT_GT(tall.scroll_y, 0.f);
        EXPECT_LT(tall.scroll_y, 40 * 4 * 16.f);
        EXPECT_GT(top, 0);
        EXPECT_GT(bottom, 0);
    }
    // It is in the view table.
    bool listed = false;
    for (const auto& e : view_table()) listed |= std::string(e.name) == "trace";
    EXPECT_TRUE(listed);
}

// GPU work: lanes per device and stream, each record pointing at the span that launched it
// (CUPTI external correlation), kept out of the span statistics.
TEST(TraceView, GpuWorkGetsLanesAndItsLaunchingSpan) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("gpu.kvlab");
    auto session = storage::Session::create(path);
    const int64_t run = session->create_run("gpu", R"({"mode":"eval_long"})");
    session->start_run(run);
    trace::Recorder rec;
    {
        storage::SessionWriter writer(path);
        writer.attach(run, rec);
        auto span = [&](const char* name, uint64_t b, uint64_t e, uint64_t corr) {
            trace::Event ev;
            ev.span = trace::SpanRecord{};
            ev.span.type = trace::EventType::SPAN;
            ev.span.category = SpanCategory::ATTENTION;
            ev.span.device = 0;
            ev.span.name_id = trace::intern(name);
            ev.span.start_ns = b;
            ev.span.end_ns = e;
            ev.span.layer = ev.span.chunk = ev.span.cell_row = ev.span.cell_col = -1;
            ev.span.correlation_id = corr;
            rec.push(ev);
        };
        span("sdpa", 1000, 2000, 501);
        span("mlp", 3000, 4000, 502);
        auto* p = new trace::GpuBatchPayload();
        const std::pair<uint64_t, uint32_t> launches[] = {{501, 1}, {502, 2}, {0, 3}};
        for (const auto& [ext, cupti] : launches) {
            GpuKernel k{};
            k.start = 1500 + cupti * 1000;
            k.end = k.start + 300;
            k.stream_id = 7 + cupti % 2;
            k.correlation_id = cupti;
            k.short_name_id = k.demangled_name_id = trace::intern(cupti == 1 ? "sdpa_kernel" : cupti == 2 ? "gemm_kernel" : "orphan");
            p->kernels.push_back(k);
            if (ext) p->correlations.push_back({ext, cupti, 3});
        }
        trace::Event ev;
        ev.gpu = trace::GpuBatchRecord{};
        ev.gpu.type = trace::EventType::GPU_BATCH;
        ev.gpu.payload = p;
        rec.push(ev);
        writer.detach(run);
    }
    session->finish_run(run, storage::RunStatus::DONE);
    storage::SessionReader reader(path);
    TraceViewState s;
    s.run = run;
    ASSERT_TRUE(refresh_trace_view(s, reader));
    const auto gpu = reader.gpu_activity(run);
    ASSERT_EQ(gpu.size(), 3u);
    size_t gpu_lanes = 0, gpu_spans = 0;
    for (const TraceLane& l : s.model.lanes) gpu_lanes += is_gpu_lane(l.thread);
    EXPECT_EQ(gpu_lanes, 2u);  // streams 7 and 8
    for (uint32_t i = 0; i < s.model.spans.size(); ++i) {
        const TraceSpan& sp = s.model.spans[i];
        if (!is_gpu_lane(sp.thread)) continue;
        ++gpu_spans;
        const std::string& name = s.model.names[sp.name];
        const uint32_t launch = find_launcher(s.model, i);
        if (name == "orphan") {
            EXPECT_EQ(launch, kNoParent);
            continue;
        }
        ASSERT_NE(launch, kNoParent) << name;
        EXPECT_EQ(s.model.names[s.model.spans[launch].name], name == "sdpa_kernel" ? "sdpa" : "mlp");
    }
    EXPECT_EQ(gpu_spans, 3u);
    // The statistics hold the two host spans only.
    expect_same(s.whole.spans, storage::span_summary(reader.spans(run)).spans, "host spans only");
    // The GPU summary, by hand: three 300 ns kernels on device 0 (2500, 3500, 4500), the first
    // launched 1500 ns after sdpa began (1000), the second 500 ns after mlp (3000), the orphan
    // unlaunched.
    ASSERT_EQ(s.gpu_whole.devices.size(), 1u);
    EXPECT_EQ(s.gpu_whole.devices[0].busy_ns, 900);
    EXPECT_EQ(s.gpu_whole.devices[0].records, 3);
    EXPECT_EQ(s.gpu_whole.launched, 2);
    EXPECT_EQ(s.gpu_whole.delay_total_ns, 2000);
    EXPECT_EQ(s.gpu_whole.delay_max_ns, 1500);
    EXPECT_EQ(s.gpu_whole.launches.size(), 3u);
    // Read back from the session, the links go both ways and the GPU icicle puts each kernel's
    // 300 ns under the span that launched it: sdpa > sdpa_kernel, mlp > gemm_kernel, the orphan
    // at the top.
    std::map<std::string, std::vector<std::string>> launched;
    for (uint32_t i = 0; i < s.model.spans.size(); ++i)
        for (uint32_t r : find_launched(s.model, i)) launched[s.model.names[s.model.spans[i].name]].push_back(s.model.names[s.model.spans[r].name]);
    EXPECT_EQ(launched, (std::map<std::string, std::vector<std::string>>{{"mlp", {"gemm_kernel"}}, {"sdpa", {"sdpa_kernel"}}}));
    std::map<std::string, int64_t> icicle;
    for (size_t i = 1; i < s.gpu_icicle.nodes.size(); ++i) {
        const IcicleNode& n = s.gpu_icicle.nodes[i];
        std::string key = n.parent > 0 ? s.model.names[s.gpu_icicle.nodes[size_t(n.parent)].name] : std::string();
        key.append("/").append(s.model.names[n.name]);
        icicle[key] = n.total_ns;
    }
    EXPECT_EQ(icicle, (std::map<std::string, int64_t>{{"/sdpa", 300}, {"/mlp", 300}, {"/orphan", 300}, {"sdpa/sdpa_kernel", 300}, {"mlp/gemm_kernel", 300}}));
    EXPECT_EQ(s.gpu_launched_whole, (std::unordered_map<std::string, int64_t>{{"sdpa", 300}, {"mlp", 300}}));
    test::ImGuiHarness h(1200, 700);
    EXPECT_GT(h.window_frame([&] { DrawTraceView(s, nullptr, ImVec2(1200, 700)); }, ImVec2(600, 120)), 0);
}

}  // namespace
}  // namespace kv::views
