// GPU summary of a trace range (see trace_gpu_summary.h).
#include "views/trace_gpu_summary.h"

#include <algorithm>
#include <map>

namespace kv::views {

GpuSummary trace_gpu_summary(const TraceModel& m, int64_t t0, int64_t t1) {
    GpuSummary g;
    if (t1 <= t0) return g;
    std::map<int32_t, std::vector<std::pair<int64_t, int64_t>>> intervals;  // device -> clipped intervals
    std::map<std::pair<uint32_t, uint32_t>, GpuLaunchGroup> groups;
    for (const TraceLane& lane : m.lanes) {
        if (!is_gpu_lane(lane.thread)) continue;
        const int32_t device = (lane.thread - kGpuLaneBase) / 4096;
        auto& iv = intervals[device];
        // A stream's records never overlap, so each sits in row 0 of its lane.
        for (const TraceRow& row : lane.rows) {
            const auto [lo, hi] = row_window(m, row, t0, t1);
            for (size_t k = lo; k < hi; ++k) {
                const uint32_t i = row.spans[k];
                const TraceSpan& sp = m.spans[i];
                const int64_t a = std::max(sp.start_ns, t0), b = std::min(sp.end_ns, t1);
                if (b < a || (b == a && sp.end_ns > sp.start_ns)) continue;  // touches the range's edge only
                iv.emplace_back(a, b);
                const uint32_t launch = find_launcher(m, i);
                GpuLaunchGroup& grp = groups[{launch == kNoParent ? UINT32_MAX : m.spans[launch].name, sp.name}];
                grp.launcher_name = launch == kNoParent ? UINT32_MAX : m.spans[launch].name;
                grp.name = sp.name;
                ++grp.count;
                grp.device_ns += b - a;
                if (launch != kNoParent) {
                    const int64_t delay = std::max<int64_t>(0, sp.start_ns - m.spans[launch].start_ns);
                    grp.delay_total_ns += delay;
                    grp.delay_max_ns = std::max(grp.delay_max_ns, delay);
                    ++g.launched;
                    g.delay_total_ns += delay;
                    g.delay_max_ns = std::max(g.delay_max_ns, delay);
                }
            }
        }
    }
    for (auto& [device, iv] : intervals) {
        GpuDeviceBusy d;
        d.device = device;
        d.records = int64_t(iv.size());
        d.range_ns = t1 - t0;
        // Union of the intervals: streams run concurrently, busy time counts once.
        std::sort(iv.begin(), iv.end());
        int64_t cur_a = 0, cur_b = 0;
        bool open = false;
        for (const auto& [a, b] : iv) {
            if (open && a <= cur_b) {
                cur_b = std::max(cur_b, b);
                continue;
            }
            if (open) d.busy_ns += cur_b - cur_a;
            cur_a = a, cur_b = b, open = true;
        }
        if (open) d.busy_ns += cur_b - cur_a;
        g.devices.push_back(d);
    }
    // A group's launcher is known for all its records or for none, so its mean delay divides by count.
    for (auto& [k, grp] : groups) g.launches.push_back(grp);
    std::sort(g.launches.begin(), g.launches.end(), [&](const GpuLaunchGroup& x, const GpuLaunchGroup& y) {
        if (x.device_ns != y.device_ns) return x.device_ns > y.device_ns;
        return std::make_pair(x.launcher_name, x.name) < std::make_pair(y.launcher_name, y.name);
    });
    return g;
}

std::unordered_map<std::string, int64_t> gpu_time_by_launcher(const GpuSummary& g, const TraceModel& m) {
    std::unordered_map<std::string, int64_t> out;
    for (const GpuLaunchGroup& grp : g.launches)
        if (grp.launcher_name != UINT32_MAX) out[m.names[grp.launcher_name]] += grp.device_ns;
    return out;
}

}  // namespace kv::views
