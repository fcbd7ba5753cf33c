// `kvlab bench telemetry`: what recording costs. Three measurements, each against a baseline
// taken in the same run: the session writer's sustained throughput (vs plain SQLite inserts),
// the cost of one traced span (vs a clock read), and the wall-time overhead of full tracing on
// a chunked h2o run of the `small` preset (vs the same run with telemetry off).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "bench_commands.h"
#include "engine/core/error.h"
#include "engine/run/run_config.h"
#include "progress.h"
#include "sessions/run_manager.h"
#include "storage/session_reader.h"
#include "bench/storage_bench.h"

namespace kv::cli {

namespace {

struct TracedRunTimes {
    double eval_s = 0;  // the run's own measured evaluation time (summary "seconds")
    double wall_s = 0;  // submit -> final status, including draining the writer
    int64_t events = 0;
};

// One run in its own session (a fresh file each time, so file growth does not favour either).
TracedRunTimes time_run(const RunConfig& base, bool traced, const std::string& dir, int index) {
    RunConfig cfg = base;
    cfg.telemetry.enabled = traced;
    const std::string path = str(dir, "/bench-", traced ? "traced" : "plain", "-", index, ".kvlab");
    std::filesystem::remove(path);
    TracedRunTimes t;
    {
        sessions::RunManager rm(path);
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t run = rm.submit(cfg);
        const auto st = rm.wait(run);
        t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (st != storage::RunStatus::DONE) throw Error(str("bench telemetry: the benchmark run failed: ", rm.result_text(run)));
        const auto summary = nlohmann::json::parse(rm.summary(run));
        t.eval_s = summary.value("seconds", 0.0);
    }
    if (traced) {
        storage::SessionReader rd(path);
        const int64_t run = rd.runs().back().id;
        for (const char* table : {"spans", "memory_events", "cache_steps", "score_snapshots", "metrics"})
            t.events += rd.count_rows(table, run);
    }
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
    return t;
}

}  // namespace

int bench_telemetry(const Args& args) {
    const bool quick = args.flag("quick");
    const std::string dir = args.str("dir", "/tmp");
    const int repeats = int(args.integer("repeats", quick ? 1 : 3, 1, 100));
    const int64_t query_rows = args.integer("query_rows", quick ? 200000 : 10000000, 1000, int64_t(1) << 32);
    Progress progress("bench telemetry");
    const int steps = 3 + 2 * repeats;
    int step = 0;

    progress.update(step++, steps, "writer throughput");
    storage::WriterBenchOptions wo;
    wo.seconds = quick ? 0.5 : 3.0;
    wo.dir = dir;
    const auto w = storage::storage_bench_writer(wo);

    progress.update(step++, steps, "span cost");
    const auto sc = storage::storage_bench_span_cost(quick ? 200000 : 2000000, dir);

    progress.update(step++, steps, str("GUI queries on ", query_rows, " rows"));
    const auto q = storage::storage_bench_queries(uint64_t(query_rows), dir);

    // A chunked h2o run of the small preset; plain and traced runs alternate so drift in the
    // machine's load hits both; the fastest of each is compared.
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = args.str("model", "small");
    cfg.data.name = "passkey";
    cfg.data.seq_length = quick ? 1024 : 4096;
    cfg.data.num_samples = quick ? 1 : 2;
    cfg.kv_cache.name = "h2o-default";
    cfg.kv_cache.cache_length = cfg.data.seq_length / 4;
    cfg.driver.chunk_size = quick ? 64 : 128;
    cfg.telemetry.cupti = false;
    std::vector<TracedRunTimes> plain, traced;
    progress.update(step, steps, "warm-up run");
    time_run(cfg, false, dir, -1);  // first-touch costs (thread pool, oneDNN kernels) go here
    for (int r = 0; r < repeats; ++r) {
        progress.update(step++, steps, str("untraced run ", r + 1));
        plain.push_back(time_run(cfg, false, dir, r));
        progress.update(step++, steps, str("traced run ", r + 1));
        traced.push_back(time_run(cfg, true, dir, r));
    }
    progress.finish();
    auto best = [](const std::vector<TracedRunTimes>& v, double TracedRunTimes::*f) {
        double b = 1e300;
        for (const auto& t : v) b = std::min(b, t.*f);
        return b;
    };
    const double eval_plain = best(plain, &TracedRunTimes::eval_s), eval_traced = best(traced, &TracedRunTimes::eval_s);
    const double wall_plain = best(plain, &TracedRunTimes::wall_s), wall_traced = best(traced, &TracedRunTimes::wall_s);

    std::printf("session writer (every index on: block-range indexes of spans and memory events, %zu rows per commit)\n", wo.batch_rows);
    std::printf("  %-44s %12.0f events/s   (wall clock; target >= 1,000,000)%s\n", "sustained, wall clock", w.events_per_s,
                w.events_per_s >= 1e6 ? "" : "  << below target");
    std::printf("  %-44s %12.0f events/s\n", "per writer-thread CPU second", w.events_per_cpu_s);
    std::printf("  %-44s %12.0f rows/s     (ratio ours/baseline %.2fx per CPU second)\n",
                "baseline: plain SQLite 5-int rows, 1 index", w.baseline_rows_per_s,
                w.baseline_rows_per_cpu_s > 0 ? w.events_per_cpu_s / w.baseline_rows_per_cpu_s : 0.0);
    std::printf("  %-44s %12.1f bytes/event, %llu events, %llu dropped by design while saturated\n", "file size",
                w.bytes_per_event, (unsigned long long)w.events_written, (unsigned long long)w.events_dropped);
    std::printf("span cost (CPU time of the recording thread)\n");
    std::printf("  %-44s %8.1f ns\n", "clock read (scale)", sc.ns_clock_read);
    std::printf("  %-44s %8.1f ns\n", "span, tracing off", sc.ns_no_recorder);
    std::printf("  %-44s %8.1f ns  (%.1fx a clock read)\n", "span, recording", sc.ns_recorder,
                sc.ns_clock_read > 0 ? sc.ns_recorder / sc.ns_clock_read : 0.0);
    std::printf("  %-44s %8.1f ns  (%llu dropped)\n", "span, recording while the writer drains", sc.ns_recorder_with_writer,
                (unsigned long long)sc.dropped_with_writer);
    std::printf("GUI queries on %llu rows (%.0f MB file, written in %.1f s)\n", (unsigned long long)q.rows,
                q.file_bytes / 1e6, q.write_seconds);
    std::printf("  %-44s %8.2f ms (%zu rows)\n", "memory events, 1% time window", q.memory_window_ms, q.memory_window_rows);
    std::printf("  %-44s %8.2f ms (%zu rows)\n", "spans overlapping a 1% window", q.spans_window_ms, q.spans_window_rows);
    std::printf("  %-44s %8.2f ms\n", "newest 10k spans (live refresh)", q.new_rows_ms);
    std::printf("  %-44s %8.2f ms (%zu rows)\n", "one layer's cache steps", q.cache_layer_ms, q.cache_layer_rows);
    std::printf("  %-44s %8.2f ms\n", "memory timeline, 1000 buckets", q.timeline_ms);
    std::printf("tracing overhead: %s, %s, %lld tokens x %lld samples, cache %lld, chunk %lld; best of %d\n",
                cfg.model.c_str(), cfg.kv_cache.name.c_str(), (long long)cfg.data.seq_length,
                (long long)cfg.data.num_samples, (long long)cfg.kv_cache.cache_length, (long long)cfg.driver.chunk_size,
                repeats);
    const double eval_ratio = eval_traced / eval_plain, wall_ratio = wall_traced / wall_plain;
    std::printf("  %-44s %8.3f s traced vs %8.3f s untraced: %.3fx (target <= 1.05)%s\n", "evaluation time", eval_traced,
                eval_plain, eval_ratio, eval_ratio <= 1.05 ? "" : "  << above target");
    std::printf("  %-44s %8.3f s traced vs %8.3f s untraced: %.3fx (incl. writer drain, model load)\n",
                "wall time per run", wall_traced, wall_plain, wall_ratio);
    std::printf("  %-44s %lld rows\n", "events recorded per traced run", (long long)traced.back().events);
    return 0;
}

}  // namespace kv::cli
