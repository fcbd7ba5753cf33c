// GPU summary of the trace view against brute force on synthetic models: busy time by marking
// every nanosecond a record covers, launch delays by a linear search for the host span with the
// record's correlation id, and the per-launcher groups by plain sums -- for the whole run and
// for sub-ranges that cut records.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "views/trace_gpu_summary.h"
#include "views/trace_model.h"

namespace kv::views {
namespace {

using trace::SpanCategory;

struct Synthetic {
    std::vector<TraceSpan> spans;
    std::vector<std::string> names{"run", "sdpa", "mlp", "copy in", "sdpa_kernel", "gemm_kernel", "memcpy HtoD"};
};

Synthetic make(uint64_t seed) {
    std::mt19937_64 rng(seed);
    Synthetic s;
    int64_t id = 0;
    s.spans.push_back({0, 60'000, 0, SpanCategory::RUN, 0, -1, -1, ++id, 0});
    // Host ops back to back under the run, each with a correlation id 100 + k.
    int64_t t = 100;
    std::vector<TraceSpan> host;
    for (int k = 0; k < 40; ++k) {
        const int64_t d = 200 + int64_t(rng() % 1000);
        host.push_back({t, t + d, uint32_t(1 + rng() % 3), SpanCategory::ATTENTION, 0, -1, -1, ++id, 100 + k});
        t += d + int64_t(rng() % 200);
    }
    for (const auto& h : host) s.spans.push_back(h);
    // GPU records on 2 devices x 2 streams, disjoint per stream; most launched by a host op
    // (which started before them), some with no correlation, some with an id no span pushed.
    for (int32_t dev = 0; dev < 2; ++dev)
        for (int32_t stream = 0; stream < 2; ++stream) {
            int64_t g = 150 + int64_t(rng() % 300);
            while (g < 58'000) {
                const int64_t d = 50 + int64_t(rng() % 900);
                const int pick = int(rng() % 10);
                int64_t corr = 0;
                if (pick < 7) {
                    // a host op that started before the record
                    std::vector<const TraceSpan*> before;
                    for (const auto& h : host)
                        if (h.start_ns <= g) before.push_back(&h);
                    if (!before.empty()) corr = before[rng() % before.size()]->correlation;
                } else if (pick == 7) {
                    corr = 9999;  // unknown launch
                }
                s.spans.push_back({g, g + d, uint32_t(4 + rng() % 3), rng() % 3 == 2 ? SpanCategory::IO : SpanCategory::OTHER,
                                   gpu_lane_thread(dev, stream), -1, -1, 0, corr});
                g += d + int64_t(rng() % 800);
            }
        }
    return s;
}

void check(const Synthetic& syn, const TraceModel& m, int64_t t0, int64_t t1) {
    SCOPED_TRACE("range " + std::to_string(t0) + " .. " + std::to_string(t1));
    const GpuSummary got = trace_gpu_summary(m, t0, t1);
    // Brute force.
    std::map<int32_t, std::vector<uint8_t>> covered;
    std::map<int32_t, int64_t> records;
    struct Group {
        int64_t count = 0, device = 0, delay = 0, delay_max = 0;
    };
    std::map<std::pair<std::string, std::string>, Group> groups;
    int64_t launched = 0, delay_total = 0, delay_max = 0;
    for (const TraceSpan& g : syn.spans) {
        if (!is_gpu_lane(g.thread)) continue;
        if (g.end_ns <= t0 || g.start_ns >= t1) continue;
        const int32_t dev = (g.thread - kGpuLaneBase) / 4096;
        auto& c = covered[dev];
        c.resize(size_t(t1 - t0), 0);
        for (int64_t x = std::max(t0, g.start_ns); x < std::min(t1, g.end_ns); ++x) c[size_t(x - t0)] = 1;
        ++records[dev];
        const TraceSpan* launcher = nullptr;
        for (const TraceSpan& h : syn.spans)
            if (!is_gpu_lane(h.thread) && h.correlation && h.correlation == g.correlation) launcher = &h;
        Group& gr = groups[{launcher ? syn.names[launcher->name] : "?", syn.names[g.name]}];
        ++gr.count;
        gr.device += std::min(t1, g.end_ns) - std::max(t0, g.start_ns);
        if (launcher) {
            const int64_t d = std::max<int64_t>(0, g.start_ns - launcher->start_ns);
            gr.delay += d, gr.delay_max = std::max(gr.delay_max, d);
            ++launched, delay_total += d, delay_max = std::max(delay_max, d);
        }
    }
    ASSERT_EQ(got.devices.size(), covered.size());
    for (const GpuDeviceBusy& d : got.devices) {
        int64_t busy = 0;
        for (uint8_t b : covered.at(d.device)) busy += b;
        EXPECT_EQ(d.busy_ns, busy) << "device " << d.device;
        EXPECT_EQ(d.records, records.at(d.device));
        EXPECT_EQ(d.range_ns, t1 - t0);
        EXPECT_LE(d.busy_share(), 1.0);
    }
    EXPECT_EQ(got.launched, launched);
    EXPECT_EQ(got.delay_total_ns, delay_total);
    EXPECT_EQ(got.delay_max_ns, delay_max);
    ASSERT_EQ(got.launches.size(), groups.size());
    for (size_t k = 0; k < got.launches.size(); ++k) {
        const GpuLaunchGroup& g = got.launches[k];
        const std::string launcher = g.launcher_name == UINT32_MAX ? "?" : m.names[g.launcher_name];
        const Group& want = groups.at({launcher, m.names[g.name]});
        EXPECT_EQ(g.count, want.count) << launcher << " > " << m.names[g.name];
        EXPECT_EQ(g.device_ns, want.device);
        EXPECT_EQ(g.delay_total_ns, want.delay);
        EXPECT_EQ(g.delay_max_ns, want.delay_max);
        if (k) {
            EXPECT_GE(got.launches[k - 1].device_ns, g.device_ns) << "device time descending";
        }
    }
}

TEST(TraceGpuSummary, BusyShareLaunchDelaysAndGroupsMatchBruteForce) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
        SCOPED_TRACE("seed " + std::to_string(seed));
        const Synthetic syn = make(seed);
        const TraceModel m = build_trace_model(syn.spans, syn.names);
        check(syn, m, m.t_min, m.t_max + 1);
        std::mt19937_64 rng(seed * 7);
        for (int r = 0; r < 4; ++r) {
            const int64_t a = int64_t(rng() % 50'000), b = a + 1 + int64_t(rng() % 20'000);
            check(syn, m, a, b);
        }
    }
}

TEST(TraceGpuSummary, AHostOnlyRunHasNone) {
    std::vector<TraceSpan> host = {{0, 100, 0, SpanCategory::RUN, 0, -1, -1, 1, 7}};
    const TraceModel m = build_trace_model(host, {"run"});
    EXPECT_TRUE(trace_gpu_summary(m, 0, 100).empty());
}

}  // namespace
}  // namespace kv::views
