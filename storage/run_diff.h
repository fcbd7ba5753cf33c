// Two runs of a session side by side, for "where did the time and memory go" (`kvlab diff` and
// the app's diff view): time and count per span name (span_summary.h) and per GPU kernel, memcpy
// and memset, the phase breakdown, peak bytes per memory category from the runs' summaries and
// per category over chunks, the kept-slot overlap per layer (kept_overlap.h), and the summary
// numbers that differ. One row type for every section, so one table carries the whole diff in
// any output format.
// Reads through SessionReader only; never writes.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "storage/kept_overlap.h"
#include "storage/query_result.h"
#include "storage/session_reader.h"
#include "storage/span_summary.h"

namespace kv::storage {

struct RunDiffRow {
    std::string section;  // "spans", "kernels", "phases", "memory", "memory_chunks", "kept_slots", "summary"
    std::string name;     // span / kernel / phase name, memory category, "layer N", summary key
    // span category; kernel, memcpy or memset; memory: device, "+ instrumentation" when with it;
    // memory_chunks: "<device> chunk N"; kept_slots: "N steps end where the other run has none" when the runs chunk differently
    std::string detail;
    // "total_ms", "self_ms", "bytes", "peak_bytes" (the largest category total among the chunk's
    // allocation events), "held" (kept_slots: (step, row, position) triples each run held) and
    // "kept_by_both" (share of the run's held triples the other run held too), "value"
    std::string measure;
    int64_t count_a = 0, count_b = 0;  // spans, kernels and phases; kept_slots: steps compared; 0 elsewhere
    double a = NAN, b = NAN;           // NaN: absent in that run
    double b_minus_a() const { return b - a; }
    double b_over_a() const { return a != 0 ? b / a : NAN; }
};

struct RunDiff {
    int64_t run_a = 0, run_b = 0;
    std::vector<RunDiffRow> rows;  // sections in the order above; spans and kernels by |B - A| descending
};

// Peak bytes of one memory category during one chunk (events tagged with that chunk index, of
// every sample), on one device.
struct ChunkMemoryPeak {
    int32_t device = -1;
    MemCategory category = MemCategory::WORKSPACE;
    int32_t chunk = 0;
    int64_t peak_bytes = 0;
};
// Device, category, chunk ascending. Events without a chunk tag are left out.
std::vector<ChunkMemoryPeak> chunk_memory_peaks(const std::vector<MemoryEventRow>& events);
// The same, fed one event at a time.
class ChunkPeakAccumulator {
   public:
    void add(const MemoryEventRow& e);
    std::vector<ChunkMemoryPeak> peaks() const;

   private:
    std::map<std::tuple<int32_t, int, int32_t>, int64_t> peak_;  // (device, category, chunk) -> bytes
};

// What the diff reads of one run.
struct RunDiffInput {
    SpanSummary spans;
    std::string summary;  // the run's summary JSON
    std::vector<GpuActivityRow> gpu;
    std::vector<ChunkMemoryPeak> chunk_memory;
    std::vector<CacheStepRow> cache_steps;
};
// Throws SessionError (INVALID) naming an unknown run id.
RunDiffInput read_run_diff_input(SessionReader& session, int64_t run);

// The diff (pure: what the reader entry point computes from the session).
RunDiff run_diff(const RunDiffInput& a, const RunDiffInput& b);
// Diff of two span summaries and summary JSON texts only (no kernels, chunks or cache steps).
RunDiff run_diff(const SpanSummary& a, const SpanSummary& b, const std::string& summary_a, const std::string& summary_b);
// Throws SessionError (INVALID) naming an unknown run id.
RunDiff run_diff(SessionReader& session, int64_t run_a, int64_t run_b);

// The diff as a table: section, name, detail, measure, count_a, count_b, a, b, b_minus_a, b_over_a.
QueryResult run_diff_table(const RunDiff& d);

}  // namespace kv::storage
