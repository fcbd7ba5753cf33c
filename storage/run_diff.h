// Two runs of a session side by side, for "where did the time and memory go" (`kvlab diff`):
// time and count per span name (span_summary.h), the phase breakdown, peak bytes per memory
// category from the runs' summaries, and the summary numbers that differ. One row type for
// every section, so one table carries the whole diff in any output format.
// Reads through SessionReader only; never writes.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "storage/query_result.h"
#include "storage/session_reader.h"
#include "storage/span_summary.h"

namespace kv::storage {

struct RunDiffRow {
    std::string section;               // "spans", "phases", "memory", "summary"
    std::string name;                  // span / phase name, memory category, summary key
    std::string detail;                // span category; memory: device, "+ instrumentation" when with it
    std::string measure;               // "total_ms", "self_ms", "bytes", "value"
    int64_t count_a = 0, count_b = 0;  // spans and phases; 0 elsewhere
    double a = NAN, b = NAN;           // NaN: absent in that run
    double b_minus_a() const { return b - a; }
    double b_over_a() const { return a != 0 ? b / a : NAN; }
};

struct RunDiff {
    int64_t run_a = 0, run_b = 0;
    std::vector<RunDiffRow> rows;  // sections in the order above; spans by |B - A| descending
};

// Diff of two summaries (pure: what the reader entry point computes from the session).
// `summary_*` are the runs' summary JSON texts.
RunDiff run_diff(const SpanSummary& a, const SpanSummary& b, const std::string& summary_a, const std::string& summary_b);
// Throws SessionError (INVALID) naming an unknown run id.
RunDiff run_diff(SessionReader& session, int64_t run_a, int64_t run_b);

// The diff as a table: section, name, detail, measure, count_a, count_b, a, b, b_minus_a, b_over_a.
QueryResult run_diff_table(const RunDiff& d);

}  // namespace kv::storage
