// GPU work of a trace model in a time range, for GPU runs: per device the share of the range
// its kernels, memcpys and memsets kept it busy (the union of their intervals, so overlapping
// streams count once) and the launch overhead (how long after its launching host span began a
// record started on the device: the delay from the CUPTI-correlated launch to the work); and
// each record nested under the host span that launched it, merged by (launching span name,
// record name) with the count, device time and launch delays. Pure, over views/trace_model.h.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "views/trace_model.h"

namespace kv::views {

struct GpuDeviceBusy {
    int32_t device = 0;
    int64_t records = 0;   // kernels, memcpys and memsets overlapping the range
    int64_t busy_ns = 0;   // union of their intervals clipped to the range
    int64_t range_ns = 0;  // the range's length
    double busy_share() const { return range_ns > 0 ? double(busy_ns) / double(range_ns) : 0.0; }
};

// GPU records of one name under host spans of one name that launched them.
struct GpuLaunchGroup {
    uint32_t launcher_name = UINT32_MAX;  // index into TraceModel::names; UINT32_MAX: launch unknown
    uint32_t name = 0;                    // the kernel / copy / set
    int64_t count = 0;
    int64_t device_ns = 0;                           // durations clipped to the range
    int64_t delay_total_ns = 0, delay_max_ns = 0;    // launch delays of the records with a launcher
    double delay_mean_ns() const { return count ? double(delay_total_ns) / double(count) : 0.0; }
};

struct GpuSummary {
    std::vector<GpuDeviceBusy> devices;  // device ascending
    std::vector<GpuLaunchGroup> launches;  // device time descending, then names
    int64_t launched = 0;                  // records with a known launcher
    int64_t delay_total_ns = 0, delay_max_ns = 0;
    double delay_mean_ns() const { return launched ? double(delay_total_ns) / double(launched) : 0.0; }
    bool empty() const { return devices.empty(); }
};

// Records overlapping [t0, t1) count; their time is clipped to it. The launch delay of a record
// is its start minus its launcher's start (clamped at 0).
GpuSummary trace_gpu_summary(const TraceModel& m, int64_t t0, int64_t t1);
// The summary's device time per launching span name (the records spans of that name launched
// themselves, not their children's), for the statistics table's GPU column.
std::unordered_map<std::string, int64_t> gpu_time_by_launcher(const GpuSummary& g, const TraceModel& m);

}  // namespace kv::views
