// Writer and span-cost benchmarks (see storage_bench.h). The event mix is half spans, half
// allocator events -- the two kinds a traced run produces by the million.
#include "bench/storage_bench.h"

#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "engine/telemetry/trace.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"

namespace kv::storage {

namespace {
using Clock = std::chrono::steady_clock;

std::string temp_session(const std::string& dir, const char* tag) {
    return str(dir.empty() ? "/tmp" : dir, "/kvlab-bench-", tag, "-", getpid(), "-",
               Clock::now().time_since_epoch().count(), ".kvlab");
}

void remove_session(const std::string& path) {
    ::unlink(path.c_str());
    ::unlink((path + "-wal").c_str());
    ::unlink((path + "-shm").c_str());
}

double thread_cpu_ns() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e9 + double(t.tv_nsec);
}

double file_size(const std::string& path) {
    struct stat st {};
    return stat(path.c_str(), &st) == 0 ? double(st.st_size) : 0.0;
}
}  // namespace

namespace {
// reference/toolchain.md section 3, reproduced: what SQLite itself does here, now.
void sqlite_baseline(const std::string& dir, double seconds, double* rows_per_s, double* rows_per_cpu_s) {
    const std::string path = temp_session(dir, "baseline");
    remove_session(path);
    sqlite3* db = nullptr;
    if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
        sqlite3_close(db);
        return;
    }
    sqlite3_exec(
        db,
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; CREATE TABLE events(run_id INTEGER, t_ns INTEGER, "
        "kind INTEGER, bytes INTEGER, layer INTEGER); CREATE INDEX events_time ON events(run_id, t_ns);",
        nullptr, nullptr, nullptr);
    sqlite3_stmt* st = nullptr;
    sqlite3_prepare_v2(db, "INSERT INTO events VALUES(?,?,?,?,?)", -1, &st, nullptr);
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_ns();
    const auto until = t0 + std::chrono::duration<double>(seconds);
    int64_t i = 0;
    while (Clock::now() < until) {
        sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
        for (int k = 0; k < 10000; ++k, ++i) {
            sqlite3_bind_int64(st, 1, 1);
            sqlite3_bind_int64(st, 2, 1000000 + i * 100);
            sqlite3_bind_int64(st, 3, i % 8);
            sqlite3_bind_int64(st, 4, 4096);
            sqlite3_bind_int64(st, 5, i % 32);
            sqlite3_step(st);
            sqlite3_reset(st);
        }
        sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
    }
    const double cpu = (thread_cpu_ns() - c0) * 1e-9;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    sqlite3_finalize(st);
    sqlite3_close(db);
    remove_session(path);
    *rows_per_s = double(i) / wall;
    *rows_per_cpu_s = cpu > 0 ? double(i) / cpu : 0;
}

template <class Fn>
double median_ms(int repeats, Fn&& fn) {
    std::vector<double> t;
    for (int r = 0; r < repeats; ++r) {
        const auto a = Clock::now();
        fn();
        t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
}  // namespace

WriterBenchResult storage_bench_writer(const WriterBenchOptions& o) {
    const std::string path = temp_session(o.dir, "writer");
    WriterBenchResult res;
    try {
        auto session = Session::create(path);
        int64_t run = session->create_run("bench writer");
        session->start_run(run);
        trace::RecorderOptions ro;
        ro.queue_capacity = size_t(1) << 18;
        trace::Recorder rec(ro);
        WriterOptions wo;
        wo.batch_rows = o.batch_rows;
        const auto t_start = Clock::now();
        WriterRunStats st;
        double busy = 0;
        {
            SessionWriter writer(path, wo);
            writer.attach(run, rec);
            static const trace::Name kName("bench span");
            const uint32_t label = trace::intern("layer 3 kv_cache K");
            std::thread producer([&] {
                const auto until = t_start + std::chrono::duration<double>(o.seconds);
                uint64_t i = 0;
                int64_t total = 0;
                while (Clock::now() < until) {
                    for (int k = 0; k < 256; ++k, ++i) {
                        trace::Event ev;
                        if (i & 1) {
                            ev.span = trace::SpanRecord{};
                            ev.span.type = trace::EventType::SPAN;
                            ev.span.category = trace::SpanCategory(i % trace::kNumSpanCategories);
                            ev.span.name_id = kName.id;
                            ev.span.start_ns = 1000000 + i * 100;
                            ev.span.end_ns = ev.span.start_ns + 50 + (i % 4096);
                            ev.span.layer = int32_t(i % 32);
                            ev.span.chunk = int32_t(i / 4096);
                            ev.span.cell_row = ev.span.cell_col = -1;
                            ev.span.thread = 1;
                        } else {
                            const int64_t bytes = (i & 2) ? 4096 : -4096;
                            total += bytes;
                            ev.alloc = trace::AllocRecord{};
                            ev.alloc.type = trace::EventType::ALLOC;
                            ev.alloc.category = MemCategory(i % kNumMemCategories);
                            ev.alloc.label_id = label;
                            ev.alloc.t_ns = 1000000 + i * 100;
                            ev.alloc.bytes = bytes;
                            ev.alloc.address = 0x10000 + (i % 1024) * 4096;
                            ev.alloc.alloc_id = i / 4;
                            ev.alloc.category_total = total;
                            ev.alloc.device_total = total;
                            ev.alloc.layer = int32_t(i % 32);
                            ev.alloc.chunk = -1;
                        }
                        // A full queue means the writer is saturated: back off instead of
                        // competing with it for a core.
                        if (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(100));
                    }
                }
            });
            producer.join();
            st = writer.detach(run);
            busy = writer.stats().busy_seconds;
            res.writer_cpu_seconds = writer.stats().cpu_seconds;
            res.commits = writer.stats().commits;
        }
        res.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
        res.events_written = st.written[size_t(trace::EventType::SPAN)] + st.written[size_t(trace::EventType::ALLOC)];
        res.events_dropped = st.recorder.total_dropped();
        res.events_per_s = res.seconds > 0 ? double(res.events_written) / res.seconds : 0;
        res.writer_busy_fraction = res.seconds > 0 ? busy / res.seconds : 0;
        res.events_per_cpu_s = res.writer_cpu_seconds > 0 ? double(res.events_written) / res.writer_cpu_seconds : 0;
        session->finish_run(run, RunStatus::DONE);
        session->checkpoint();
        res.file_bytes = file_size(path);
        res.bytes_per_event = res.events_written ? res.file_bytes / double(res.events_written) : 0;
        sqlite_baseline(o.dir, std::min(o.seconds, 2.0), &res.baseline_rows_per_s, &res.baseline_rows_per_cpu_s);
    } catch (...) {
        remove_session(path);
        throw;
    }
    remove_session(path);
    return res;
}

QueryBenchResult storage_bench_queries(uint64_t rows, const std::string& dir) {
    const std::string path = temp_session(dir, "queries");
    QueryBenchResult res;
    res.rows = rows;
    try {
        auto session = Session::create(path);
        int64_t run = session->create_run("bench queries");
        session->start_run(run);
        trace::Recorder rec;
        const uint64_t base = 1'000'000'000;
        const uint64_t step = 100;  // ns between events
        {
            const auto t = Clock::now();
            SessionWriter writer(path);
            writer.attach(run, rec);
            static const trace::Name kName("bench span"), kRun("run");
            const uint32_t label = trace::intern("layer 3 kv_cache K");
            trace::Event ev;
            ev.span = trace::SpanRecord{};
            ev.span.type = trace::EventType::SPAN;
            ev.span.name_id = kRun.id;
            ev.span.start_ns = base;
            ev.span.end_ns = base + rows * step;
            ev.span.layer = ev.span.chunk = ev.span.cell_row = ev.span.cell_col = -1;
            rec.push(ev);
            int64_t total = 0;
            for (uint64_t i = 0; i < rows; ++i) {
                if (i % 256 == 0)
                    while (rec.stats().pending > 100000) std::this_thread::sleep_for(std::chrono::microseconds(200));
                if (i & 1) {
                    ev.span = trace::SpanRecord{};
                    ev.span.type = trace::EventType::SPAN;
                    ev.span.category = trace::SpanCategory(i % trace::kNumSpanCategories);
                    ev.span.name_id = kName.id;
                    ev.span.start_ns = base + i * step;
                    ev.span.end_ns = ev.span.start_ns + 50 + (i % 4096);
                    ev.span.layer = int32_t(i % 32);
                    ev.span.chunk = int32_t(i / 4096);
                    ev.span.cell_row = ev.span.cell_col = -1;
                    ev.span.thread = 1;
                } else {
                    const int64_t bytes = (i & 2) ? 4096 : -4096;
                    total += bytes;
                    ev.alloc = trace::AllocRecord{};
                    ev.alloc.type = trace::EventType::ALLOC;
                    ev.alloc.category = MemCategory(i % kNumMemCategories);
                    ev.alloc.label_id = label;
                    ev.alloc.t_ns = base + i * step;
                    ev.alloc.bytes = bytes;
                    ev.alloc.alloc_id = i / 4;
                    ev.alloc.category_total = total;
                    ev.alloc.device_total = total;
                    ev.alloc.layer = int32_t(i % 32);
                    ev.alloc.chunk = -1;
                }
                while (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(200));
                // One cache step per (layer, chunk of 4096 events), with a small replay log.
                if (i % 128 == 0) {
                    ev.cache_step = trace::CacheStepRecord{};
                    ev.cache_step.type = trace::EventType::CACHE_STEP;
                    ev.cache_step.layer = int32_t((i / 128) % 32);
                    ev.cache_step.chunk = int32_t(i / 4096);
                    ev.cache_step.num_tokens = 64;
                    ev.cache_step.cache_length = 512;
                    ev.cache_step.t_ns = base + i * step;
                    ev.cache_step.replay_log = new std::vector<uint8_t>(256, uint8_t(i));
                    while (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(200));
                }
            }
            writer.detach(run);
            res.write_seconds = std::chrono::duration<double>(Clock::now() - t).count();
        }
        session->finish_run(run, RunStatus::DONE);
        session->checkpoint();
        res.file_bytes = file_size(path);
        SessionReader reader(path);
        const int64_t t0 = int64_t(base), span = int64_t(rows * step);
        const TimeWindow w{t0 + span / 2, t0 + span / 2 + span / 100};
        res.memory_window_ms = median_ms(5, [&] { res.memory_window_rows = reader.memory_events(run, w).size(); });
        res.spans_window_ms = median_ms(5, [&] { res.spans_window_rows = reader.spans(run, w).size(); });
        const int64_t last = reader.spans(run, {t0 + span - span / 1000, t0 + span + 1}).back().id;
        res.new_rows_ms = median_ms(5, [&] { reader.spans(run, {}, last - 20000, 10000); });
        res.cache_layer_ms = median_ms(5, [&] { res.cache_layer_rows = reader.cache_steps(run, 7).size(); });
        res.timeline_ms = median_ms(1, [&] { reader.memory_timeline(run, -1, {}, 1000); });
    } catch (...) {
        remove_session(path);
        throw;
    }
    remove_session(path);
    return res;
}

SpanCostResult storage_bench_span_cost(uint64_t spans, const std::string& dir) {
    SpanCostResult res;
    res.spans = spans;
    static const trace::Name kName("bench span");
    auto loop = [&](uint64_t n) {
        const double t = thread_cpu_ns();
        for (uint64_t i = 0; i < n; ++i) {
            trace::SpanScope s(trace::SpanCategory::ATTENTION, kName, {.layer = int32_t(i & 31), .chunk = 7});
        }
        return thread_cpu_ns() - t;
    };
    {
        const double t = thread_cpu_ns();
        uint64_t sum = 0;
        for (uint64_t i = 0; i < spans; ++i) sum += now_ns();
        res.ns_clock_read = (thread_cpu_ns() - t) / double(spans) + (sum == 1 ? 1e-9 : 0.0);
    }
    // Tracing off.
    res.ns_no_recorder = loop(spans) / double(spans);
    // Recording into queues nobody drains: blocks that fit, discarded between blocks (untimed).
    {
        trace::RecorderOptions ro;
        ro.queue_capacity = size_t(1) << 16;
        trace::Recorder rec(ro);
        trace::RecorderScope scope(rec);
        double ns = 0;
        uint64_t done = 0;
        while (done < spans) {
            uint64_t n = std::min<uint64_t>(spans - done, 60000);
            ns += loop(n);
            done += n;
            rec.discard();
        }
        res.ns_recorder = ns / double(spans);
    }
    // Recording while a writer drains into a session.
    const std::string path = temp_session(dir, "spans");
    try {
        auto session = Session::create(path);
        int64_t run = session->create_run("bench span cost");
        session->start_run(run);
        trace::RecorderOptions ro;
        ro.queue_capacity = size_t(1) << 16;
        trace::Recorder rec(ro);
        {
            SessionWriter writer(path);
            writer.attach(run, rec);
            {
                trace::RecorderScope scope(rec);
                res.ns_recorder_with_writer = loop(spans) / double(spans);
            }
            WriterRunStats st = writer.detach(run);
            res.dropped_with_writer = st.recorder.dropped[size_t(trace::EventType::SPAN)];
        }
        session->finish_run(run, RunStatus::DONE);
    } catch (...) {
        remove_session(path);
        throw;
    }
    remove_session(path);
    return res;
}

}  // namespace kv::storage
