// What the trace view draws, derived once from a run's spans (no ImGui, tested and benchmarked
// on its own): one lane per thread whose rows are nesting depths (run > phase > cell > layer >
// chunk > op), each row's spans disjoint and in time order, so a window's spans are found by
// binary search; per row, level-of-detail copies where neighbours closer than a level's gap are
// merged, so a frame draws at most about one box per pixel whatever the span count; the time a
// root span's children leave uncovered, as unattributed intervals; the icicle (aggregated flame
// graph: spans merged by their path of names); and a name search's durations as a histogram.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/rows.h"
#include "storage/span_summary.h"

namespace kv::views {

// One span, compact (a 10-million-span run fits in memory beside its names).
struct TraceSpan {
    int64_t start_ns = 0, end_ns = 0;
    uint32_t name = 0;  // index into TraceModel::names
    trace::SpanCategory category = trace::SpanCategory::OTHER;
    int32_t thread = 0;
    int32_t layer = -1, chunk = -1;
    int64_t id = 0;  // the span row's id (ties of identical intervals: the later-written is outer)
    // Host spans: the CUPTI external correlation id they pushed (0: none). GPU work: the id of
    // the span that launched it.
    int64_t correlation = 0;
};

// GPU work (CUPTI kernels, memcpys, memsets) sits in lanes of its own, one per device and
// stream, on pseudo-threads from here up; kernels have category OTHER, copies and sets IO.
constexpr int32_t kGpuLaneBase = 1 << 20;
inline int32_t gpu_lane_thread(int32_t device, int32_t stream) { return kGpuLaneBase + device * 4096 + (stream & 4095); }
inline bool is_gpu_lane(int32_t thread) { return thread >= kGpuLaneBase; }

// A run of neighbouring spans drawn as one box at a level of detail.
struct TraceMerged {
    int64_t start_ns = 0, end_ns = 0;
    uint32_t count = 0;                                         // spans merged
    trace::SpanCategory category = trace::SpanCategory::OTHER;  // of the longest of them
};

// One depth of one lane: spans that never overlap, in time order (so sorted by end as well).
struct TraceRow {
    std::vector<uint32_t> spans;  // indices into TraceModel::spans
    // levels[k]: the spans merged across gaps shorter than lod_gap_ns(k); disjoint, in order.
    std::vector<std::vector<TraceMerged>> levels;
};

struct TraceLane {
    int32_t thread = 0;
    std::vector<TraceRow> rows;  // rows[d]: spans at nesting depth d
    // Time inside a root span (depth 0) that no depth-1 span covers: drawn as "unattributed"
    // on row 1, with levels like a row's (category unused).
    std::vector<TraceMerged> unattributed;
    std::vector<std::vector<TraceMerged>> unattributed_levels;
};

constexpr uint32_t kNoParent = UINT32_MAX;

// Gap under which level k merges neighbours: 1 us x 4^k.
int64_t lod_gap_ns(size_t level);
constexpr size_t kTraceLodLevels = 12;  // 1 us .. ~4 s gaps

struct TraceModel {
    std::vector<TraceSpan> spans;
    std::vector<uint32_t> parent;  // per span: its enclosing span on its thread (kNoParent: a root)
    std::vector<std::string> names;
    std::vector<TraceLane> lanes;  // by thread; GPU lanes (is_gpu_lane) last
    int64_t t_min = 0, t_max = 0;
    // Host span index by correlation id: the launch of a GPU span (find_launcher).
    std::unordered_map<int64_t, uint32_t> launchers;
    // The other way: the GPU records host span i launched are launched[launched_at[i] ..
    // launched_at[i + 1]) in time order (both empty when no record has a known launcher).
    std::vector<uint32_t> launched_at, launched;
};
// The host span that launched GPU span `i` (kNoParent when unknown).
uint32_t find_launcher(const TraceModel& m, uint32_t i);
// The GPU records host span `i` launched (empty for a GPU span or a span that launched none).
std::span<const uint32_t> find_launched(const TraceModel& m, uint32_t i);
// Span i's row in its lane: how many spans enclose it.
size_t span_depth(const TraceModel& m, uint32_t i);

// Builds lanes, rows, levels and unattributed time. `spans` may be in any order.
TraceModel build_trace_model(std::vector<TraceSpan> spans, std::vector<std::string> names);
// Spans of `row` overlapping [t0, t1): an index range into row.spans.
std::pair<size_t, size_t> row_window(const TraceModel& m, const TraceRow& row, int64_t t0, int64_t t1);
// Merged boxes overlapping [t0, t1) of a level: an index range into `level`.
std::pair<size_t, size_t> merged_window(const std::vector<TraceMerged>& level, int64_t t0, int64_t t1);
// The coarsest level whose gap is at most `ns_per_px` (gaps merged there are under a pixel);
// -1 when even the finest gap spans more than a pixel (spans are drawn one by one).
int pick_lod_level(double ns_per_px);

// ---- statistics over the model --------------------------------------------------------------
// The span rows (names resolved) of every span, for storage functions and tests.
std::vector<storage::SpanRow> trace_span_rows(const TraceModel& m);
// The summary of [t0, t1) (host spans clipped to it; GPU lanes are not spans) with storage::span_summary's definitions, from
// the model's parent links instead of a re-sort and without copying names: fast enough to
// follow a range selection on ten million spans.
storage::SpanSummary trace_range_summary(const TraceModel& m, int64_t t0, int64_t t1);

// The icicle: host spans merged by path of (name, category) from their thread's root; roots of all
// threads merged by name too. nodes[0] is a synthetic root whose total is the roots' sum.
struct IcicleNode {
    uint32_t name = 0;
    trace::SpanCategory category = trace::SpanCategory::OTHER;
    int32_t parent = -1;
    int32_t depth = 0;
    int64_t total_ns = 0;  // durations of the spans at this path
    int64_t self_ns = 0;   // total minus the children's totals
    int64_t count = 0;
    bool gpu = false;               // a GPU record's name (GPU icicle leaves)
    std::vector<int32_t> children;  // total descending
    double x0 = 0, x1 = 0;          // layout: [x0, x1) in pixels for the width given to layout
};
struct Icicle {
    std::vector<IcicleNode> nodes;
};
// The icicle of [t0, t1) (the defaults: the whole run): durations clipped to the range as
// trace_range_summary clips them; a span outside it is left out, and a counted span whose
// parent is not counted (a zero-length span at the range's edge) hangs under its nearest
// counted ancestor.
Icicle build_icicle(const TraceModel& m, int64_t t0 = INT64_MIN, int64_t t1 = INT64_MAX);
// The GPU icicle: device time attributed to the launching span's path. A host path's total is
// the device time of the kernels, copies and sets launched by spans on it or below it (self
// 0); under it a leaf per record name (gpu = true) holds what spans at that path launched
// directly. Records with no known launcher are leaves of the root; paths that launched
// nothing are left out. Counts are records. With a range: the records inside it, their device
// time clipped to it, under their launcher's path even when the launch came before the range.
Icicle build_gpu_icicle(const TraceModel& m, int64_t t0 = INT64_MIN, int64_t t1 = INT64_MAX);
// Places nodes: the root spans `width` pixels; a child starts where its previous sibling ends,
// each node's width is total_ns * width / root total.
void layout_icicle(Icicle& ic, double width);

// Spans whose name contains `needle` (case-insensitive): count, durations and a histogram of
// `bins` log-spaced bins between the shortest and longest (Tracy's Find Zone).
struct SpanSearch {
    std::string needle;
    int64_t count = 0, total_ns = 0, min_ns = 0, max_ns = 0;
    // Nearest-rank percentiles of the sorted durations d[0..count): the median is d[ceil(count / 2) - 1],
    // p95 is d[ceil(0.95 count) - 1].
    int64_t median_ns = 0, p95_ns = 0;
    std::vector<int64_t> bins;      // counts
    std::vector<double> bin_edges;  // ns, bins + 1 edges
    std::vector<uint32_t> matches;  // span indices, longest first (first 1000)
    std::vector<char> name_matches;  // per name index: whether it contains the needle
    double log_lo = 0, log_hi = 0;   // the histogram's range, log ns
};
SpanSearch search_spans(const TraceModel& m, const std::string& needle, int bins = 24);
// The histogram bin a duration falls in (-1 when the search has no bins).
int search_bin(const SpanSearch& f, int64_t duration_ns);
// The matching spans of bin `bin` (what a click on its bar selects), longest first, the first `limit`.
std::vector<uint32_t> search_bin_spans(const TraceModel& m, const SpanSearch& f, int bin, size_t limit = 1000);

}  // namespace kv::views
