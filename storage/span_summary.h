// Where a run's time goes: per span name and category, the count, total and self time (total
// minus the time its child spans cover) and min/max/mean; and the run's phase breakdown (the
// RUN-category spans: "run" and its phases). Pure functions over SpanRow plus one reader entry
// point; `kvlab diff`, the `top-spans`/`phases` named queries and the tests share them.
// Never writes, never formats.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "storage/session_reader.h"

namespace kv::storage {

// Nesting rule (the one the SQL of named_queries.cpp reproduces): spans nest by time
// containment on one thread. Per (thread), spans in preorder -- start ascending, end
// descending, id descending (of two identical intervals the outer one is written last, so has
// the larger id) -- and a span's parent is the nearest span before it in that order whose end
// is not before its own. The recorder's scopes nest properly on a thread, so this is plain
// containment; zero-length spans have no time to give or take.
struct SpanStats {
    std::string name;
    trace::SpanCategory category = trace::SpanCategory::OTHER;
    int64_t count = 0;
    int64_t total_ns = 0;  // sum of durations
    int64_t self_ns = 0;   // total minus the durations of direct children
    int64_t min_ns = 0, max_ns = 0;
    int32_t layer = -1;  // the model layer (entries of SpanSummary::layers only)
    double mean_ns() const { return count ? double(total_ns) / double(count) : 0.0; }
};

struct SpanSummary {
    // One entry per (name, category), self time descending (then name, category).
    std::vector<SpanStats> spans;
    // One entry per category (name ""): the sums of the entries above; self time descending, ties
    // by category name.
    std::vector<SpanStats> categories;
    // One entry per model layer (spans tagged with a layer >= 0; name ""): the count, total and
    // self time of the spans tagged with it, under the nesting of all spans. Layer ascending.
    std::vector<SpanStats> layers;
    // RUN-category spans nested among themselves only: "run" and the phases. A phase's self
    // time leaves out the phases opened inside it (as the summary's phase_seconds does), not
    // its ops. Self time descending.
    std::vector<SpanStats> phases;
    int64_t run_ns = 0;           // total of the "run" spans (0 when the run has none)
    int64_t unattributed_ns = 0;  // the "run" spans' self time among phases: time in no phase
};

// Self time of every span, index-aligned with `spans`, under the nesting rule above.
std::vector<int64_t> span_self_times(const std::vector<SpanRow>& spans);
// The summary of a set of spans (one run's). With a window, each span is first clipped to it
// (spans outside it are dropped), so totals are the time spent inside the window.
SpanSummary span_summary(const std::vector<SpanRow>& spans, const TimeWindow& window = {});
// Reads run `run`'s spans (overlapping `window`, on the engine clock) and summarizes them.
SpanSummary span_summary(SessionReader& session, int64_t run, const TimeWindow& window = {});

}  // namespace kv::storage
