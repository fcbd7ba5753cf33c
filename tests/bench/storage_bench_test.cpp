// Smoke test of the storage benchmarks behind `kvlab bench telemetry`: they run, write and
// clean up, and report sane numbers. Speed targets live in the benchmark, not here.
#include <gtest/gtest.h>

#include <filesystem>

#include "bench/storage_bench.h"
#include "../storage/storage_test_util.h"

namespace kv {
namespace {

TEST(StorageBench, WriterAndSpanCostReportNumbersAndCleanUp) {
    test::ScratchDir dir;
    storage::WriterBenchOptions o;
    o.seconds = 0.3;
    o.dir = dir.path();
    storage::WriterBenchResult w = storage::storage_bench_writer(o);
    std::printf(
        "[ info ] writer: %.0f events/s wall, %.0f events per writer CPU-second (%llu events, %.2f s, %.1f "
        "B/event, %llu commits, busy %.0f%%)\n",
        w.events_per_s, w.events_per_cpu_s, (unsigned long long)w.events_written, w.seconds, w.bytes_per_event,
        (unsigned long long)w.commits, 100 * w.writer_busy_fraction);
    std::printf(
        "[ info ] SQLite baseline (toolchain.md 3): %.0f rows/s wall, %.0f rows per CPU-second; ours/baseline %.2f\n",
        w.baseline_rows_per_s, w.baseline_rows_per_cpu_s,
        w.baseline_rows_per_cpu_s > 0 ? w.events_per_cpu_s / w.baseline_rows_per_cpu_s : 0.0);
    EXPECT_GT(w.events_written, 1000u);
    EXPECT_GT(w.baseline_rows_per_cpu_s, 0.0);
    EXPECT_GT(w.events_per_s, 0.0);
    EXPECT_GT(w.bytes_per_event, 0.0);
    storage::SpanCostResult s = storage::storage_bench_span_cost(200000, dir.path());
    std::printf("[ info ] span (CPU ns): %.1f off, %.1f recording, %.1f with writer (%llu dropped); clock read %.1f\n",
                s.ns_no_recorder, s.ns_recorder, s.ns_recorder_with_writer, (unsigned long long)s.dropped_with_writer,
                s.ns_clock_read);
    EXPECT_GT(s.ns_recorder, 0.0);
    storage::QueryBenchResult q = storage::storage_bench_queries(20000, dir.path());
    EXPECT_GT(q.memory_window_rows, 0u);
    EXPECT_GT(q.spans_window_rows, 1u);  // the run-long span plus spans inside the window
    EXPECT_GT(q.cache_layer_rows, 0u);
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "benchmark sessions were not removed";
}

}  // namespace
}  // namespace kv
