// Storage half of `kvlab bench telemetry`: sustained writer throughput (events/s into a session
// file with every index on) and the cost of one traced span with and without a consumer. Returns
// numbers only; printing and targets belong to the CLI. Uses a temporary session it deletes.
#pragma once

#include <cstdint>
#include <string>

namespace kv::storage {

struct WriterBenchOptions {
    double seconds = 3.0;      // how long the producer keeps the queues full
    std::string dir = "/tmp";  // where the temporary session goes
    size_t batch_rows = 10000;
};

struct WriterBenchResult {
    uint64_t events_written = 0;    // spans + memory events stored
    uint64_t events_dropped = 0;    // producer overflow while the writer was saturated (expected)
    double seconds = 0;             // from the first push until everything was committed
    double events_per_s = 0;        // events_written / seconds (wall clock; shared machines lower it)
    double writer_cpu_seconds = 0;  // CPU time of the writer thread
    double events_per_cpu_s = 0;    // events_written / writer_cpu_seconds: what one dedicated core sustains
    uint64_t commits = 0;
    double file_bytes = 0;  // session size after the run (data + indexes)
    double bytes_per_event = 0;
    double writer_busy_fraction = 0;  // writer thread time spent draining/writing
    // Baseline measured in the same run: plain SQLite inserting the 5-integer rows of
    // reference/toolchain.md section 3 (one index, 10k rows per commit, one row per statement).
    // On an idle machine of this kind it does ~1.03M rows/s; events_per_cpu_s / baseline says
    // how our 13-14 column rows with their indexes compare, independent of machine load.
    double baseline_rows_per_s = 0;
    double baseline_rows_per_cpu_s = 0;
};
WriterBenchResult storage_bench_writer(const WriterBenchOptions& options = {});

// How fast the GUI's queries are on a large session: `rows` events (half spans, half memory
// events) plus cache steps for 32 layers, then each query timed (median of repeats, ms).
struct QueryBenchResult {
    uint64_t rows = 0;
    double write_seconds = 0;
    double file_bytes = 0;
    double memory_window_ms = 0;  // 1% time window of the run's memory events
    size_t memory_window_rows = 0;
    double spans_window_ms = 0;  // spans overlapping a 1% window (incl. the run-long span)
    size_t spans_window_rows = 0;
    double new_rows_ms = 0;     // the newest 10k spans after a row id (live refresh)
    double cache_layer_ms = 0;  // one layer's cache steps
    size_t cache_layer_rows = 0;
    double timeline_ms = 0;  // decimated memory timeline of the whole run, 1000 buckets
};
QueryBenchResult storage_bench_queries(uint64_t rows = 10000000, const std::string& dir = "/tmp");

// Costs are CPU time of the recording thread per span (other load on a shared machine does
// not count); a span is two clock reads plus one queue push.
struct SpanCostResult {
    uint64_t spans = 0;
    double ns_clock_read = 0;            // one kv::now_ns(), for scale
    double ns_no_recorder = 0;           // tracing off: one thread-local load
    double ns_recorder = 0;              // recording, queue never full, nobody draining
    double ns_recorder_with_writer = 0;  // recording while a SessionWriter drains into SQLite
    uint64_t dropped_with_writer = 0;    // spans lost because they outran the writer
};
SpanCostResult storage_bench_span_cost(uint64_t spans = 2000000, const std::string& dir = "/tmp");

}  // namespace kv::storage
