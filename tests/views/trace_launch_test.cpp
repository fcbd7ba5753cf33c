// Launch links of the trace view (CUPTI correlation) against brute force on synthetic GPU
// runs with nested host spans (no GPU needed): the records a host span launched are those
// whose correlation id equals the span's, found by a linear scan; the GPU icicle's device time
// per path equals sums over each record's launcher path, the path found by an
// innermost-containing-span search over the raw spans (not the model's parent links); and the
// view draws one arrow per launch of the selected span.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "views/trace_model.h"
#include "views/trace_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

using trace::SpanCategory;

struct GpuRun {
    std::vector<TraceSpan> spans;
    std::vector<std::string> names{"run", "cell", "layer", "attention", "mlp", "sdpa", "gemm_kernel", "sdpa_kernel", "memcpy HtoD"};
};

// Host trees on two threads (run > cell > layer > attention/mlp > sdpa), a third of the spans
// with a correlation id; GPU records on two devices x two streams, most launched by a random
// host span with an id that started before them, some with no id or an id no span pushed.
GpuRun make_gpu_run(uint64_t seed) {
    std::mt19937_64 rng(seed);
    GpuRun g;
    int64_t id = 0, corr = 100;
    std::vector<size_t> with_id;
    auto add = [&](int32_t thread, int64_t b, int64_t e, uint32_t name, SpanCategory c) {
        TraceSpan s{b, e, name, c, thread, -1, -1, ++id, 0};
        if (rng() % 3 == 0) s.correlation = corr++, with_id.push_back(g.spans.size());
        g.spans.push_back(s);
    };
    for (int32_t thread = 0; thread < 2; ++thread) {
        const int64_t base = thread * 7'000;
        add(thread, base, base + 90'000, 0, SpanCategory::RUN);
        for (int cell = 0; cell < 3; ++cell) {
            const int64_t cb = base + 1'000 + cell * 29'000;
            add(thread, cb, cb + 27'000, 1, SpanCategory::CELL);
            for (int layer = 0; layer < 4; ++layer) {
                const int64_t lb = cb + 500 + layer * 6'500;
                add(thread, lb, lb + 6'000, 2, SpanCategory::LAYER);
                const bool attn = rng() % 2;
                add(thread, lb + 100, lb + 3'000, attn ? 3 : 4, attn ? SpanCategory::ATTENTION : SpanCategory::MLP);
                if (attn) add(thread, lb + 200, lb + 2'000, 5, SpanCategory::ATTENTION);
            }
        }
    }
    for (int32_t dev = 0; dev < 2; ++dev)
        for (int32_t stream = 0; stream < 2; ++stream) {
            int64_t t = 300 + int64_t(rng() % 500);
            while (t < 95'000) {
                const int64_t d = 20 + int64_t(rng() % 700);
                const int pick = int(rng() % 10);
                int64_t c = 0;
                if (pick < 8) {
                    std::vector<size_t> before;
                    for (size_t k : with_id)
                        if (g.spans[k].start_ns <= t) before.push_back(k);
                    if (!before.empty()) c = g.spans[before[rng() % before.size()]].correlation;
                } else if (pick == 8) {
                    c = 99'999;  // an id no span pushed
                }
                g.spans.push_back({t, t + d, uint32_t(6 + rng() % 3), rng() % 3 == 2 ? SpanCategory::IO : SpanCategory::OTHER,
                                   gpu_lane_thread(dev, stream), -1, -1, 0, c});
                t += d + int64_t(rng() % 400);
            }
        }
    return g;
}

// Innermost host span on the same thread containing span c, by scanning all spans (the
// generator writes no identical intervals).
long brute_parent(const std::vector<TraceSpan>& s, size_t c) {
    long best = -1;
    for (size_t p = 0; p < s.size(); ++p) {
        if (p == c || s[p].thread != s[c].thread || s[p].start_ns > s[c].start_ns || s[p].end_ns < s[c].end_ns) continue;
        if (best < 0 || s[p].end_ns - s[p].start_ns < s[size_t(best)].end_ns - s[size_t(best)].start_ns) best = long(p);
    }
    return best;
}

long brute_launcher(const std::vector<TraceSpan>& s, const TraceSpan& g) {
    if (!g.correlation) return -1;
    for (size_t k = 0; k < s.size(); ++k)
        if (!is_gpu_lane(s[k].thread) && s[k].correlation == g.correlation) return long(k);
    return -1;
}

std::string key_of(const std::vector<std::string>& names, uint32_t name, SpanCategory c, bool gpu) {
    std::string k = gpu ? "gpu:" : "";
    k.append(names[name]).append("#").append(std::to_string(int(c)));
    return k;
}

TEST(TraceLaunch, LaunchedRecordsAreTheInverseOfTheCorrelation) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        const GpuRun g = make_gpu_run(seed);
        const TraceModel m = build_trace_model(g.spans, g.names);
        size_t linked = 0;
        for (uint32_t i = 0; i < m.spans.size(); ++i) {
            const TraceSpan& h = m.spans[i];
            std::vector<std::pair<int64_t, int32_t>> want;  // (start, lane) of the records with h's id
            if (!is_gpu_lane(h.thread) && h.correlation)
                for (const TraceSpan& x : m.spans)
                    if (is_gpu_lane(x.thread) && x.correlation == h.correlation) want.emplace_back(x.start_ns, x.thread);
            std::vector<std::pair<int64_t, int32_t>> got;
            for (uint32_t r : find_launched(m, i)) {
                got.emplace_back(m.spans[r].start_ns, m.spans[r].thread);
                EXPECT_EQ(find_launcher(m, r), i);
            }
            EXPECT_TRUE(std::is_sorted(got.begin(), got.end(), [](auto& a, auto& b) { return a.first < b.first; })) << i;
            std::sort(want.begin(), want.end());
            std::sort(got.begin(), got.end());
            EXPECT_EQ(got, want) << "span " << i;
            linked += got.size();
        }
        EXPECT_GT(linked, 20u);  // the generator did link records
    }
}

TEST(TraceLaunch, SpanDepthIsItsRow) {
    const GpuRun g = make_gpu_run(7);
    const TraceModel m = build_trace_model(g.spans, g.names);
    for (const TraceLane& lane : m.lanes)
        for (size_t d = 0; d < lane.rows.size(); ++d)
            for (uint32_t i : lane.rows[d].spans) ASSERT_EQ(span_depth(m, i), d);
}

TEST(TraceLaunch, GpuIcicleAttributesDeviceTimeToTheLaunchingPath) {
    for (uint64_t seed = 1; seed <= 4; ++seed) {
        const GpuRun g = make_gpu_run(seed);
        const TraceModel m = build_trace_model(g.spans, g.names);
        // Brute force: each record's device time added to every prefix of "launcher's path from
        // its root / record", the path by containment search; records with no launcher at "/record".
        std::map<std::string, std::pair<int64_t, int64_t>> want;  // path -> (device ns, records)
        int64_t all = 0;
        for (const TraceSpan& r : g.spans) {
            if (!is_gpu_lane(r.thread)) continue;
            const int64_t d = r.end_ns - r.start_ns;
            all += d;
            std::vector<std::string> path;
            for (long p = brute_launcher(g.spans, r); p >= 0; p = brute_parent(g.spans, size_t(p)))
                path.insert(path.begin(), key_of(g.names, g.spans[size_t(p)].name, g.spans[size_t(p)].category, false));
            path.push_back(key_of(g.names, r.name, r.category, true));
            std::string at;
            for (const std::string& part : path) {
                at.append("/").append(part);
                want[at].first += d;
                want[at].second += 1;
            }
        }
        const Icicle ic = build_gpu_icicle(m);
        std::map<std::string, std::pair<int64_t, int64_t>> got;
        for (size_t i = 1; i < ic.nodes.size(); ++i) {
            std::vector<std::string> parts;
            for (int32_t n = int32_t(i); n > 0; n = ic.nodes[size_t(n)].parent)
                parts.push_back(key_of(m.names, ic.nodes[size_t(n)].name, ic.nodes[size_t(n)].category, ic.nodes[size_t(n)].gpu));
            std::string path;
            for (auto it = parts.rbegin(); it != parts.rend(); ++it) path.append("/").append(*it);
            ASSERT_EQ(got.count(path), 0u) << "two nodes for " << path;
            got[path] = {ic.nodes[i].total_ns, ic.nodes[i].count};
            // Host paths own no device time; leaves are all self.
            EXPECT_EQ(ic.nodes[i].self_ns, ic.nodes[i].gpu ? ic.nodes[i].total_ns : 0) << path;
            EXPECT_EQ(ic.nodes[i].gpu, ic.nodes[i].children.empty()) << path;
        }
        EXPECT_EQ(got, want) << "seed " << seed;
        EXPECT_EQ(ic.nodes[0].total_ns, all);
        // The summary's view of the same attribution: per launching span name, the device time
        // of the records it launched directly equals the icicle's leaves under paths ending in it.
        std::map<std::string, int64_t> by_launcher;
        for (size_t i = 1; i < ic.nodes.size(); ++i)
            if (ic.nodes[i].gpu && ic.nodes[i].parent > 0) by_launcher[m.names[ic.nodes[size_t(ic.nodes[i].parent)].name]] += ic.nodes[i].total_ns;
        std::map<std::string, int64_t> from_summary;
        for (const GpuLaunchGroup& grp : trace_gpu_summary(m, m.t_min, m.t_max + 1).launches)
            if (grp.launcher_name != UINT32_MAX) from_summary[m.names[grp.launcher_name]] += grp.device_ns;
        EXPECT_EQ(by_launcher, from_summary);
    }
}

// The statistics table's GPU column: per launching span name, the device time (clipped to the
// range) of the records whose correlation id a span of that name pushed, by linear scans.
TEST(TraceLaunch, GpuTimePerLauncherNameIsTheLaunchedRecordsTime) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        const GpuRun g = make_gpu_run(seed);
        const TraceModel m = build_trace_model(g.spans, g.names);
        for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{m.t_min, m.t_max + 1}, {20'000, 55'555}, {30'100, 30'900}}) {
            std::map<std::string, int64_t> want;
            for (const TraceSpan& r : g.spans) {
                if (!is_gpu_lane(r.thread)) continue;
                const long l = brute_launcher(g.spans, r);
                const int64_t a = std::max(r.start_ns, t0), b = std::min(r.end_ns, t1);
                if (l < 0 || b <= a) continue;
                want[g.names[g.spans[size_t(l)].name]] += b - a;
            }
            const auto got_u = gpu_time_by_launcher(trace_gpu_summary(m, t0, t1), m);
            std::map<std::string, int64_t> got(got_u.begin(), got_u.end());
            std::erase_if(got, [](const auto& kv) { return kv.second == 0; });  // records touching the edge only
            EXPECT_EQ(got, want) << "seed " << seed << " range " << t0 << ".." << t1;
        }
    }
}

// A selected range's icicles: host spans and GPU records clipped to the range, by brute force
// over the raw spans. Host: each span's clipped duration at its full path (parents by
// containment search), its self time the clipped duration minus its direct children's. GPU:
// each record's clipped device time added to every prefix of its launcher's path, the
// launcher found by correlation id over the whole run (a launch before the range still names
// the path of the work inside it).
TEST(TraceLaunch, RangeIciclesClipHostAndDeviceTimeToTheRange) {
    using Paths = std::map<std::string, std::pair<int64_t, int64_t>>;  // path -> (ns, count)
    auto path_of = [](const GpuRun& g, long p) {
        std::vector<std::string> parts;
        for (; p >= 0; p = brute_parent(g.spans, size_t(p)))
            parts.insert(parts.begin(), key_of(g.names, g.spans[size_t(p)].name, g.spans[size_t(p)].category, false));
        std::string at;
        for (const std::string& part : parts) at.append("/").append(part);
        return at;
    };
    auto nodes_of = [](const Icicle& ic, const std::vector<std::string>& names, Paths& total, std::map<std::string, int64_t>* self) {
        for (size_t i = 1; i < ic.nodes.size(); ++i) {
            std::vector<std::string> parts;
            for (int32_t n = int32_t(i); n > 0; n = ic.nodes[size_t(n)].parent)
                parts.push_back(key_of(names, ic.nodes[size_t(n)].name, ic.nodes[size_t(n)].category, ic.nodes[size_t(n)].gpu));
            std::string path;
            for (auto it = parts.rbegin(); it != parts.rend(); ++it) path.append("/").append(*it);
            ASSERT_EQ(total.count(path), 0u) << "two nodes for " << path;
            total[path] = {ic.nodes[i].total_ns, ic.nodes[i].count};
            if (self) (*self)[path] = ic.nodes[i].self_ns;
        }
    };
    for (uint64_t seed = 1; seed <= 3; ++seed) {
        const GpuRun g = make_gpu_run(seed);
        const TraceModel m = build_trace_model(g.spans, g.names);
        std::mt19937_64 rng(seed * 31);
        std::vector<std::pair<int64_t, int64_t>> ranges{{m.t_min, m.t_max + 1}, {20'000, 55'555}, {30'100, 30'900}};
        for (int r = 0; r < 4; ++r) {
            const int64_t a = int64_t(rng() % 90'000);
            ranges.push_back({a, a + 1 + int64_t(rng() % 30'000)});
        }
        for (const auto& [t0, t1] : ranges) {
            SCOPED_TRACE("seed " + std::to_string(seed) + " range " + std::to_string(t0) + ".." + std::to_string(t1));
            auto clip = [&](const TraceSpan& x) { return std::min(x.end_ns, t1) - std::max(x.start_ns, t0); };  // <= 0: outside
            Paths want_host, want_gpu;
            std::map<std::string, int64_t> want_self;
            int64_t host_all = 0, gpu_all = 0;
            for (size_t k = 0; k < g.spans.size(); ++k) {
                const TraceSpan& x = g.spans[k];
                const int64_t d = clip(x);
                if (d <= 0) continue;  // the generator writes no zero-length span
                if (!is_gpu_lane(x.thread)) {
                    const std::string at = path_of(g, long(k));
                    want_host[at].first += d;
                    want_host[at].second += 1;
                    int64_t self = d;
                    for (size_t c = 0; c < g.spans.size(); ++c)
                        if (!is_gpu_lane(g.spans[c].thread) && brute_parent(g.spans, c) == long(k)) self -= std::max<int64_t>(0, clip(g.spans[c]));
                    want_self[at] += self;
                    if (brute_parent(g.spans, k) < 0) host_all += d;
                    continue;
                }
                gpu_all += d;
                std::string at = path_of(g, brute_launcher(g.spans, x));
                std::vector<std::string> prefixes;
                for (size_t cut = at.find('/', 1); cut != std::string::npos; cut = at.find('/', cut + 1)) prefixes.push_back(at.substr(0, cut));
                if (!at.empty()) prefixes.push_back(at);
                prefixes.push_back(at + "/" + key_of(g.names, x.name, x.category, true));
                for (const std::string& pre : prefixes) {
                    want_gpu[pre].first += d;
                    want_gpu[pre].second += 1;
                }
            }
            const Icicle host = build_icicle(m, t0, t1), gpu = build_gpu_icicle(m, t0, t1);
            Paths got_host, got_gpu;
            std::map<std::string, int64_t> got_self;
            nodes_of(host, m.names, got_host, &got_self);
            nodes_of(gpu, m.names, got_gpu, nullptr);
            EXPECT_EQ(got_host, want_host);
            EXPECT_EQ(got_self, want_self);
            EXPECT_EQ(host.nodes[0].total_ns, host_all);
            EXPECT_EQ(got_gpu, want_gpu);
            EXPECT_EQ(gpu.nodes[0].total_ns, gpu_all);
            // The view keeps them with the selection (what the icicle tab draws while a range is selected).
            TraceViewState s;
            set_trace_model(s, build_trace_model(g.spans, g.names));
            select_trace_range(s, t0, t1);
            Paths view_gpu;
            nodes_of(s.range_gpu_icicle, s.model.names, view_gpu, nullptr);
            EXPECT_EQ(view_gpu, want_gpu);
        }
        // Without a range, the whole run's icicles are the range [t_min, t_max + 1)'s.
        Paths whole, ranged;
        nodes_of(build_gpu_icicle(m), m.names, whole, nullptr);
        nodes_of(build_gpu_icicle(m, m.t_min, m.t_max + 1), m.names, ranged, nullptr);
        EXPECT_EQ(whole, ranged);
    }
}

TEST(TraceLaunch, AHostOnlyRunHasNoGpuIcicle) {
    GpuRun g = make_gpu_run(3);
    std::erase_if(g.spans, [](const TraceSpan& s) { return is_gpu_lane(s.thread); });
    const TraceModel m = build_trace_model(g.spans, g.names);
    EXPECT_EQ(build_gpu_icicle(m).nodes.size(), 1u);
    EXPECT_TRUE(m.launched.empty());
    EXPECT_TRUE(find_launched(m, 0).empty());
}

TEST(TraceLaunch, TheSelectedSpanDrawsAnArrowPerLaunch) {
    const GpuRun g = make_gpu_run(5);
    TraceViewState s;
    s.run = 1;
    set_trace_model(s, build_trace_model(g.spans, g.names));
    const TraceModel& m = s.model;
    // The host span that launched the most records, and one of its records.
    uint32_t host = kNoParent;
    for (uint32_t i = 0; i < m.spans.size(); ++i)
        if (!is_gpu_lane(m.spans[i].thread) && (host == kNoParent || find_launched(m, i).size() > find_launched(m, host).size())) host = i;
    ASSERT_NE(host, kNoParent);
    const auto recs = find_launched(m, host);
    ASSERT_GE(recs.size(), 2u);
    test::ImGuiHarness h(1400, 900);
    auto draw = [&] { return h.window_frame([&] { DrawTraceView(s, nullptr, ImVec2(1400, 900)); }); };
    draw();
    EXPECT_EQ(s.drawn_links, 0u);
    select_trace_span(s, host);
    draw();
    EXPECT_EQ(s.drawn_links, recs.size());  // the whole run is in view
    select_trace_span(s, recs[0]);
    draw();
    EXPECT_EQ(s.drawn_links, 1u);
    // Zoomed to the first record: only the records in the window are linked.
    select_trace_span(s, host);
    s.follow = false;
    s.time = {double(m.spans[recs[0]].start_ns - s.t0_ns), double(m.spans[recs[0]].end_ns - s.t0_ns)};
    draw();
    size_t in_window = 0;
    for (uint32_t r : recs)
        in_window += m.spans[r].end_ns >= m.spans[recs[0]].start_ns && m.spans[r].start_ns <= m.spans[recs[0]].end_ns;
    EXPECT_EQ(s.drawn_links, in_window);
    // A record without a launcher links nothing.
    for (uint32_t i = 0; i < m.spans.size(); ++i)
        if (is_gpu_lane(m.spans[i].thread) && find_launcher(m, i) == kNoParent) {
            select_trace_span(s, i);
            s.follow = true;
            draw();
            EXPECT_EQ(s.drawn_links, 0u);
            break;
        }
    // The icicle panel switches to device time by launch path.
    s.panel = TracePanel::ICICLE;
    s.icicle_gpu = true;
    EXPECT_GT(draw(), 0);
    draw();
    EXPECT_EQ(s.drawn_panel, TracePanel::ICICLE);
}

// Clicks as a user makes them: a press and release in place selects the span under the mouse
// (clicks down the middle of the timeline select host spans and GPU records whose interval holds
// the middle of the run, within a few pixels), and a press dragged sideways pans instead.
TEST(TraceLaunch, AClickSelectsTheSpanUnderTheMouseAndADragDoesNot) {
    const GpuRun g = make_gpu_run(2);
    TraceViewState s;
    s.run = 1;
    set_trace_model(s, build_trace_model(g.spans, g.names));
    const TraceModel& m = s.model;
    const float W = 1400, H = 900;
    test::ImGuiHarness h(W, H);
    auto frame = [&](ImVec2 mouse, bool down) { h.window_frame([&] { DrawTraceView(s, nullptr, ImVec2(W, H)); }, mouse, down); };
    frame(ImVec2(-100, -100), false);
    const int64_t extent = m.t_max - m.t_min, mid = m.t_min + extent / 2;
    std::set<uint32_t> picked;
    bool host = false, gpu = false;
    float first_y = -1;
    uint32_t first_span = kNoParent;
    for (float y = 40; y < 500; y += 5) {
        s.selected = kNoParent;
        const ImVec2 at(W * 0.5f, y);
        frame(at, false);
        frame(at, true);
        frame(at, false);
        if (s.selected == kNoParent) continue;
        const TraceSpan& sp = m.spans[s.selected];
        // The frame's left margin (lane labels) moves the middle a few percent off the run's.
        EXPECT_LE(sp.start_ns, mid + extent / 20) << m.names[sp.name];
        EXPECT_GE(sp.end_ns, mid - extent / 20) << m.names[sp.name];
        if (first_y < 0) first_y = y, first_span = s.selected;
        picked.insert(s.selected);
        (is_gpu_lane(sp.thread) ? gpu : host) = true;
    }
    EXPECT_GE(picked.size(), 3u);
    EXPECT_TRUE(host);
    EXPECT_TRUE(gpu);
    // Selecting a span moves nothing: with another span selected, the first point that hit a
    // span hits the same one.
    ASSERT_GE(picked.size(), 2u);
    s.selected = *picked.rbegin() == first_span ? *picked.begin() : *picked.rbegin();
    frame(ImVec2(W * 0.5f, first_y), false), frame(ImVec2(W * 0.5f, first_y), true), frame(ImVec2(W * 0.5f, first_y), false);
    EXPECT_EQ(s.selected, first_span);
    // A drag from a span (zoomed in, so there is room to pan): the window pans, the selection stays.
    s.follow = false;
    s.time = {double(extent) * 0.25, double(extent) * 0.75};
    const uint32_t before = *picked.begin();
    s.selected = before;
    float y_of_before = -1;
    for (float y = 40; y < 500 && y_of_before < 0; y += 5) {  // a row that holds a span at the middle
        const ImVec2 at(W * 0.5f, y);
        s.selected = kNoParent;
        frame(at, false), frame(at, true), frame(at, false);
        if (s.selected != kNoParent) y_of_before = y;
        s.selected = before;
    }
    ASSERT_GE(y_of_before, 0);
    const AxisRange window = s.time;
    frame(ImVec2(W * 0.5f, y_of_before), false);
    for (int k = 0; k <= 8; ++k) frame(ImVec2(W * 0.5f + float(k) * 10, y_of_before), true);
    frame(ImVec2(W * 0.5f + 80, y_of_before), false);
    EXPECT_EQ(s.selected, before);
    EXPECT_NE(s.time.lo, window.lo) << "the drag panned";
}

}  // namespace
}  // namespace kv::views
