// SessionWriter (see session_writer.h).
//
// Why readers never wait behind this writer, and this writer never waits behind readers: the
// session is in WAL mode, where a reader works on the snapshot that was committed when its
// read transaction began and a writer appends to the -wal file without taking any lock readers
// hold. The only operation that waits for readers is a checkpoint that must finish
// (TRUNCATE/RESTART); this writer only ever lets SQLite run PASSIVE auto-checkpoints, which copy
// what they can and skip pages a reader still needs. So the GUI, reading on its own read-only
// connections at >= 10 Hz, never stalls ingest, and ingest never stalls the GUI: it sees every
// batch as soon as it is committed (at most commit_interval_ms after the event).
//
// Index
//   [SECTION] Impl: connection, statements, string ids, per-run accounting
//   [SECTION] Rows: one function per event type
//   [SECTION] Transactions, progress and summaries
//   [SECTION] Thread and requests
#include "session_writer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/telemetry/string_table.h"
#include "storage/batched_insert.h"
#include "storage/event_blocks.h"
#include "storage/record_tables.h"
#include "storage/session_file.h"
#include "storage/space_reserve.h"
#include "storage/sqlite_util.h"

namespace kv::storage {

using trace::Event;
using trace::EventType;

namespace {
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

}  // namespace

// =========================================================================================
// [SECTION] Impl
// =========================================================================================
struct RunSlot {
    int64_t id = 0;
    trace::Recorder* recorder = nullptr;
    int64_t t0_ns = 0;
    std::array<uint64_t, trace::kNumEventTypes> written{};
    std::array<uint64_t, trace::kNumEventTypes> pending{};  // in the open transaction
    uint64_t rows = 0, pending_rows = 0, lost = 0;
    std::map<int, int64_t> peak_device;                                   // device code -> bytes
    // The same without instrumentation (events flagged ALLOC_FLAGS_INSTRUMENTATION): the run's
    // own peak, and the instrumentation's.
    std::map<int, int64_t> instrumentation_now, peak_device_own, peak_instrumentation;
    std::map<int, std::array<int64_t, kNumMemCategories>> peak_category;  // device code -> bytes
    // Per category apart from instrumentation: its bytes in the category now, and the rest's peak.
    std::map<int, std::array<int64_t, kNumMemCategories>> instrumentation_category_now, peak_category_own;
    bool progress_dirty = false;
    trace::ProgressRecord progress{};
    Clock::time_point last_summary = Clock::now();
    EventBlockBuilder blocks;  // block-range index rows of its spans and memory events
};

struct SessionWriter::Impl : trace::EventSink {
    std::unique_ptr<Db> db;
    std::unique_ptr<BatchedInsert> ins_span, ins_mem;  // the two high-volume tables
    std::unique_ptr<EventBlockInserts> ins_blocks;
    Stmt max_span_id, max_mem_id;
    Stmt ins_cache, ins_score, ins_cell, ins_metric, ins_log;
    Stmt ins_kernel, ins_memcpy, ins_memset, ins_memory, ins_corr;
    Stmt find_string, ins_string, upd_progress, upd_summary, get_t0;
    int64_t global_pid = int64_t(getpid()) << 24;  // nsys encodes the pid in globalPid's upper bits

    std::vector<std::unique_ptr<RunSlot>> runs;
    RunSlot* current = nullptr;  // run whose events are being drained

    std::vector<int64_t> sid;          // intern id -> StringIds.id (0 = not mapped yet)
    std::vector<std::string> sname;    // intern id -> text (cache of trace::interned)
    std::vector<uint32_t> sid_in_txn;  // mappings created in the open transaction
    bool in_txn = false;
    bool txn_failed = false;
    Clock::time_point txn_start{};
    uint64_t txn_rows = 0;
    std::string last_error;
    WriterStats stats;
    std::function<void(int64_t, uint64_t, const std::string&)> on_fault;

    // Through the reserve VFS: telemetry stops short of a full disk, so the run's end still fits.
    explicit Impl(const std::string& path)
        : db(open_session_db(path, OpenMode::READ_WRITE, /*writer=*/true, reserve_vfs_name())) {
        ins_span = std::make_unique<BatchedInsert>(*db, tables::spans().insert_columns(), tables::spans().nvalues);
        ins_mem = std::make_unique<BatchedInsert>(*db, tables::memory_events().insert_columns(),
                                                  tables::memory_events().nvalues);
        ins_blocks = std::make_unique<EventBlockInserts>(*db);
        // The block index names row ids before the multi-row INSERTs run (see BatchedInsert).
        max_span_id = db->prepare("SELECT coalesce(max(id), 0) FROM spans");
        max_mem_id = db->prepare("SELECT coalesce(max(id), 0) FROM memory_events");
        ins_cache = db->prepare(tables::cache_steps().insert_sql());
        ins_score = db->prepare(tables::score_snapshots().insert_sql());
        ins_cell = db->prepare(tables::cells().insert_sql());
        ins_metric = db->prepare(tables::metrics().insert_sql());
        ins_log = db->prepare(tables::logs().insert_sql());
        ins_kernel = db->prepare(tables::cupti_kernel().insert_sql());
        ins_memcpy = db->prepare(tables::cupti_memcpy().insert_sql());
        ins_memset = db->prepare(tables::cupti_memset().insert_sql());
        ins_memory = db->prepare(tables::cuda_memory_usage().insert_sql());
        ins_corr = db->prepare(tables::cupti_external_correlation().insert_sql());
        find_string = db->prepare("SELECT id FROM StringIds WHERE value=?");
        ins_string = db->prepare("INSERT INTO StringIds(value) VALUES(?)");
        upd_progress = db->prepare(
            "UPDATE runs SET tokens_done=?, tokens_total=?, chunks_done=?, chunks_total=?, steps_done=?, "
            "steps_total=?, progress_ms=? WHERE id=?");
        upd_summary = db->prepare("UPDATE runs SET summary=json_patch(summary, ?) WHERE id=?");
        get_t0 = db->prepare("SELECT t0_ns FROM runs WHERE id=?");
    }

    // SQLite's words for a failed write, plus why when it was the reserve that refused it.
    static std::string fault_text(const std::exception& e) {
        if (!take_reserve_refusal()) return e.what();
        return str(e.what(), " (telemetry stops while ", kTelemetryReserveBytes / 1024,
                   " KiB are still free, kept for the run's end record)");
    }

    // Text of an interned id (cached: trace::interned takes a lock).
    const std::string& name_of(uint32_t id) {
        if (id >= sname.size()) sname.resize(size_t(id) + 1);
        if (id && sname[id].empty()) sname[id] = trace::interned(id);
        return sname[id];
    }

    // StringIds.id for an interned id, inserting the string on first use (inside the open
    // transaction; forgotten again if that transaction rolls back).
    int64_t string_id(uint32_t id) {
        if (id < sid.size() && sid[id]) return sid[id];
        if (id >= sid.size()) sid.resize(size_t(id) + 1, 0);
        const std::string& text = name_of(id);
        find_string.bind(1, std::string_view(text));
        int64_t out = find_string.step() ? find_string.i64(0) : 0;
        find_string.reset();
        if (!out) {
            ins_string.bind(1, std::string_view(text));
            ins_string.insert();
            out = sqlite3_last_insert_rowid(db->handle());
            sid_in_txn.push_back(id);
        }
        sid[id] = out;
        return out;
    }

    // ---- EventSink ------------------------------------------------------------------------
    void on_event(Event& ev) override {
        RunSlot& r = *current;
        if (txn_failed) {
            ++r.lost;
            return;
        }
        try {
            ensure_txn();
            uint64_t rows = write(r, ev);
            ++r.pending[size_t(ev.type())];
            r.pending_rows += rows;
            txn_rows += rows;
        } catch (const std::exception& e) {
            // The transaction is rolled back after this drain; everything in it is counted lost.
            txn_failed = true;
            last_error = fault_text(e);
            ++r.lost;
        }
    }

    // =====================================================================================
    // [SECTION] Rows
    // =====================================================================================
    uint64_t write(RunSlot& r, Event& ev) {
        switch (ev.type()) {
            case EventType::SPAN:
                return write_span(r, ev.span);
            case EventType::ALLOC:
                return write_alloc(r, ev.alloc);
            case EventType::CACHE_STEP:
                return write_cache_step(r, ev.cache_step);
            case EventType::SCORES:
                return write_scores(r, ev.scores);
            case EventType::CELL:
                return write_cell(r, ev.cell);
            case EventType::METRIC:
                return write_metric(r, ev.metric);
            case EventType::LOG:
                return write_log(r, ev.log);
            case EventType::PROGRESS:
                r.progress = ev.progress;
                r.progress_dirty = true;
                return 0;
            case EventType::GPU_BATCH:
                return write_gpu(r, ev.gpu);
            case EventType::COUNT:
                break;
        }
        return 0;
    }

    uint64_t write_span(RunSlot& r, const trace::SpanRecord& s) {
        const int64_t name = string_id(s.name_id);
        const int64_t id = ins_span->next_rowid();
        tables::spans().fill(ins_span->next(), {r.id, name, s});
        ins_span->push();
        r.blocks.add_span(id, int64_t(s.start_ns), int64_t(s.end_ns));
        return 1;
    }

    uint64_t write_alloc(RunSlot& r, const trace::AllocRecord& a) {
        const int64_t label = string_id(a.label_id);
        const int64_t id = ins_mem->next_rowid();
        tables::memory_events().fill(ins_mem->next(), {r.id, label, a});
        ins_mem->push();
        r.blocks.add_memory(id, int64_t(a.t_ns), a.device, int(a.category), a.category_total, a.device_total);
        int64_t& peak = r.peak_device[a.device];
        peak = std::max(peak, a.device_total);
        int64_t& instr = r.instrumentation_now[a.device];
        if (a.flags & trace::ALLOC_FLAGS_INSTRUMENTATION) instr += a.bytes;
        int64_t& own = r.peak_device_own[a.device];
        own = std::max(own, a.device_total - instr);
        int64_t& ipeak = r.peak_instrumentation[a.device];
        ipeak = std::max(ipeak, instr);
        auto& pc = r.peak_category[a.device];
        if (size_t(a.category) < kNumMemCategories) {
            const size_t c = size_t(a.category);
            pc[c] = std::max(pc[c], a.category_total);
            int64_t& ic = r.instrumentation_category_now[a.device][c];
            if (a.flags & trace::ALLOC_FLAGS_INSTRUMENTATION) ic += a.bytes;
            int64_t& oc = r.peak_category_own[a.device][c];
            oc = std::max(oc, a.category_total - ic);
        }
        return 1;
    }

    uint64_t write_cache_step(RunSlot& r, const trace::CacheStepRecord& c) {
        tables::cache_steps().bind(ins_cache, {r.id, c});
        ins_cache.insert();
        return 1;
    }

    uint64_t write_scores(RunSlot& r, const trace::ScoresRecord& s) {
        const trace::ScorePayload* p = s.payload;
        if (!p) return 0;
        tables::score_snapshots().bind(ins_score, {r.id, s, *p});
        ins_score.insert();
        return 1;
    }

    uint64_t write_cell(RunSlot& r, const trace::CellRecord& c) {
        tables::cells().bind(ins_cell, {r.id, c});
        ins_cell.insert();
        return 1;
    }

    uint64_t write_metric(RunSlot& r, const trace::MetricRecord& m) {
        tables::metrics().bind(ins_metric, {r.id, std::string_view(name_of(m.name_id)), m});
        ins_metric.insert();
        return 1;
    }

    uint64_t write_log(RunSlot& r, const trace::LogRecord& l) {
        static const std::string kEmpty;
        tables::logs().bind(ins_log, {r.id, std::string_view(l.text ? *l.text : kEmpty), l});
        ins_log.insert();
        return 1;
    }

    uint64_t write_gpu(RunSlot& r, const trace::GpuBatchRecord& g) {
        const trace::GpuBatchPayload* p = g.payload;
        if (!p) return 0;
        for (const GpuKernel& k : p->kernels) {
            tables::cupti_kernel().bind(ins_kernel, {r.id, global_pid, string_id(k.demangled_name_id), string_id(k.short_name_id), k});
            ins_kernel.insert();
        }
        for (const GpuMemcpy& c : p->memcpys) {
            tables::cupti_memcpy().bind(ins_memcpy, {r.id, global_pid, c});
            ins_memcpy.insert();
        }
        for (const GpuMemset& s : p->memsets) {
            tables::cupti_memset().bind(ins_memset, {r.id, global_pid, s});
            ins_memset.insert();
        }
        for (const GpuMemory& m : p->memory) {
            tables::cuda_memory_usage().bind(ins_memory, {r.id, global_pid, string_id(m.name_id), m});
            ins_memory.insert();
        }
        for (const GpuCorrelation& x : p->correlations) {
            tables::cupti_external_correlation().bind(ins_corr, {r.id, x});
            ins_corr.insert();
        }
        return p->size();
    }

    // =====================================================================================
    // [SECTION] Transactions, progress and summaries
    // =====================================================================================
    void ensure_txn() {
        if (in_txn) return;
        take_reserve_refusal();  // one of an earlier checkpoint is not this batch's
        db->exec("BEGIN IMMEDIATE", "starting a write batch");
        in_txn = true;
        txn_start = Clock::now();
        txn_rows = 0;
        // Row ids of this batch (the block index names them before the INSERTs run): the write
        // lock is ours until COMMIT, so max + 1 now is what SQLite will give, even when another
        // process wrote to the session since our last batch.
        auto next_id = [](Stmt& q) {
            const int64_t v = q.step() ? q.i64(0) + 1 : 1;
            q.reset();
            return v;
        };
        ins_span->set_next_rowid(next_id(max_span_id));
        ins_mem->set_next_rowid(next_id(max_mem_id));
    }

    bool commit_due(const WriterOptions& o) const {
        return in_txn && (txn_rows >= o.batch_rows ||
                          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - txn_start).count() >=
                              o.commit_interval_ms);
    }

    void write_progress(RunSlot& r) {
        if (!r.progress_dirty) return;
        const auto& p = r.progress;
        upd_progress.bind(1, p.tokens_done)
            .bind(2, p.tokens_total)
            .bind(3, p.chunks_done)
            .bind(4, p.chunks_total)
            .bind(5, p.steps_done)
            .bind(6, p.steps_total)
            .bind(7, std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count())
            .bind(8, r.id);
        upd_progress.insert();
        r.progress_dirty = false;
    }

    std::string summary_json(RunSlot& r) {
        nlohmann::json j;
        trace::RecorderStats rs = r.recorder ? r.recorder->stats() : trace::RecorderStats{};
        nlohmann::json written, dropped;
        for (size_t t = 0; t < trace::kNumEventTypes; ++t) {
            written[trace::event_type_name(EventType(t))] = r.written[t];
            dropped[trace::event_type_name(EventType(t))] = rs.dropped[t];
        }
        j["events_written"] = written;
        j["events_dropped"] = dropped;
        j["dropped_total"] = rs.total_dropped();
        j["gpu_records_dropped"] = rs.gpu_dropped;
        j["events_lost"] = r.lost;
        j["rows"] = r.rows;
        nlohmann::json peaks = nlohmann::json::object(), by_cat = nlohmann::json::object();
        for (const auto& [dev, bytes] : r.peak_device) peaks[trace::device_code_name(dev)] = bytes;
        for (const auto& [dev, cats] : r.peak_category) {
            nlohmann::json c = nlohmann::json::object();
            for (size_t i = 0; i < kNumMemCategories; ++i)
                if (cats[i]) c[mem_category_name(MemCategory(i))] = cats[i];
            by_cat[trace::device_code_name(dev)] = c;
        }
        j["peak_bytes"] = peaks;
        j["peak_bytes_by_category"] = by_cat;
        nlohmann::json own_cat = nlohmann::json::object();
        for (const auto& [dev, cats] : r.peak_category_own) {
            nlohmann::json c = nlohmann::json::object();
            for (size_t i = 0; i < kNumMemCategories; ++i)
                if (r.peak_category[dev][i]) c[mem_category_name(MemCategory(i))] = cats[i];
            own_cat[trace::device_code_name(dev)] = c;
        }
        j["peak_bytes_by_category_without_instrumentation"] = own_cat;
        nlohmann::json own = nlohmann::json::object(), instr = nlohmann::json::object();
        for (const auto& [dev, bytes] : r.peak_device_own) own[trace::device_code_name(dev)] = bytes;
        for (const auto& [dev, bytes] : r.peak_instrumentation)
            if (bytes > 0) instr[trace::device_code_name(dev)] = bytes;
        j["peak_bytes_without_instrumentation"] = own;
        if (!instr.empty()) j["peak_bytes_instrumentation"] = instr;
        if (r.progress.tokens_done > 0 && r.t0_ns > 0 && r.progress.t_ns > uint64_t(r.t0_ns))
            j["tokens_per_s"] = double(r.progress.tokens_done) / (double(r.progress.t_ns - uint64_t(r.t0_ns)) * 1e-9);
        if (!last_error.empty()) j["writer_error"] = last_error;
        return j.dump();
    }

    void write_summary(RunSlot& r) {
        std::string js = summary_json(r);
        upd_summary.bind(1, std::string_view(js)).bind(2, r.id);
        upd_summary.insert();
        r.last_summary = Clock::now();
    }

    // Commits the open batch (with progress and due summaries). On failure everything in the
    // batch is counted lost, the error kept, and the writer carries on with the next batch.
    void commit(const WriterOptions& o, bool summaries) {
        if (!in_txn) return;
        if (!txn_failed) {
            try {
                for (auto& r : runs) {
                    write_progress(*r);
                    if (summaries ||
                        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - r->last_summary).count() >=
                            o.summary_interval_ms) {
                        // Counts in the summary include the batch being committed.
                        auto saved = r->written;
                        for (size_t t = 0; t < trace::kNumEventTypes; ++t) r->written[t] += r->pending[t];
                        r->rows += r->pending_rows;
                        write_summary(*r);
                        r->written = saved;
                        r->rows -= r->pending_rows;
                    }
                }
                ins_span->flush();
                ins_mem->flush();
                for (auto& r : runs) {
                    std::vector<SpanBlockRow> sb;
                    std::vector<MemoryBlockRow> mb;
                    r->blocks.close(sb, mb);
                    ins_blocks->write(r->id, sb, mb);
                }
                db->exec("COMMIT", "committing a write batch");
                in_txn = false;
                ++stats.commits;
                for (auto& r : runs) r->blocks.commit();
                for (auto& r : runs) {
                    for (size_t t = 0; t < trace::kNumEventTypes; ++t) {
                        r->written[t] += r->pending[t];
                        stats.events += r->pending[t];
                    }
                    r->rows += r->pending_rows;
                    stats.rows += r->pending_rows;
                    r->pending = {};
                    r->pending_rows = 0;
                }
                sid_in_txn.clear();
                return;
            } catch (const std::exception& e) {
                last_error = fault_text(e);
            }
        }
        rollback();
    }

    void rollback() {
        ins_span->clear();
        ins_mem->clear();
        sqlite3_exec(db->handle(), "ROLLBACK", nullptr, nullptr, nullptr);
        for (auto& r : runs) r->blocks.rollback();
        in_txn = false;
        txn_failed = false;
        ++stats.failed_commits;
        for (auto& r : runs) {
            uint64_t lost_now = 0;
            for (size_t t = 0; t < trace::kNumEventTypes; ++t) lost_now += r->pending[t];
            r->lost += lost_now;
            r->pending = {};
            r->pending_rows = 0;
            // Told within the batch that failed, so the run can stop instead of losing more.
            if (on_fault && (lost_now || r->lost)) on_fault(r->id, r->lost, last_error);
        }
        for (uint32_t id : sid_in_txn)
            if (id < sid.size()) sid[id] = 0;
        sid_in_txn.clear();
    }

    // Drains up to `budget` events of one run; commits whenever a batch fills.
    size_t drain_run(RunSlot& r, size_t budget, const WriterOptions& o) {
        current = &r;
        size_t n = r.recorder->drain(*this, budget);
        if (txn_failed) rollback();
        if (commit_due(o)) commit(o, false);
        return n;
    }

    size_t drain_all(const WriterOptions& o) {
        size_t n = 0;
        for (auto& r : runs) n += drain_run(*r, o.batch_rows, o);
        return n;
    }

    // Drains what was queued when called: until a drain comes back short (the queues were empty
    // at that moment) or as many events as were pending at the start have been taken, so
    // producers that keep pushing cannot keep a flush or detach waiting forever.
    void drain_until_empty(RunSlot& r, const WriterOptions& o) {
        const size_t pending = r.recorder->stats().pending;
        size_t taken = 0;
        for (;;) {
            size_t n = drain_run(r, o.batch_rows, o);
            taken += n;
            if (n < o.batch_rows || taken >= pending) break;
        }
    }
};

// =========================================================================================
// [SECTION] Thread and requests
// =========================================================================================
SessionWriter::SessionWriter(const std::string& path, const WriterOptions& options)
    : path_(path), options_(options), impl_(std::make_unique<Impl>(path)) {
    impl_->on_fault = options.on_fault;
    if (options_.batch_rows < 1) options_.batch_rows = 1;
    thread_ = std::thread([this] { thread_main(); });
}

SessionWriter::~SessionWriter() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

namespace {
[[noreturn]] void rethrow_request_error(const std::string& msg) { throw SessionError(SessionErrorKind::INVALID, msg); }
}  // namespace

void SessionWriter::attach(int64_t run_id, trace::Recorder& recorder) {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t seq = next_seq_++;
    requests_.push_back({Request::ATTACH, run_id, &recorder, seq});
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return done_seq_ >= seq; });
    for (auto it = request_errors_.begin(); it != request_errors_.end(); ++it)
        if (it->first == seq) {
            std::string msg = it->second;
            request_errors_.erase(it);
            rethrow_request_error(msg);
        }
}

WriterRunStats SessionWriter::detach(int64_t run_id) {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t seq = next_seq_++;
    requests_.push_back({Request::DETACH, run_id, nullptr, seq});
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return done_seq_ >= seq; });
    for (auto it = request_errors_.begin(); it != request_errors_.end(); ++it)
        if (it->first == seq) {
            std::string msg = it->second;
            request_errors_.erase(it);
            rethrow_request_error(msg);
        }
    for (auto it = detach_results_.begin(); it != detach_results_.end(); ++it)
        if (it->first == seq) {
            WriterRunStats s = std::move(it->second);
            detach_results_.erase(it);
            return s;
        }
    return {};
}

void SessionWriter::flush() {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t seq = next_seq_++;
    requests_.push_back({Request::FLUSH, 0, nullptr, seq});
    cv_.notify_all();
    done_cv_.wait(lk, [&] { return done_seq_ >= seq; });
}

WriterStats SessionWriter::stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stats_;
}

namespace {
// Fewer events than this in one pass over the queues: sleep idle_sleep_ms before the next.
constexpr size_t kBusyThreshold = 1024;
// The longest poll period while the queues stay empty (a run without telemetry, a paused
// one). Every wake-up on a 2-core machine preempts one of a decode's two compute threads:
// a 2 ms period woke the writer ~480 times a second during `generate --telemetry.enabled
// false` (1100 involuntary switches of the compute threads in 3 s). 32 ms of the fastest
// producer (~120k events/s, decode with every span and allocation) is ~4k events, far inside
// a queue's 64k; a row waits at most commit_interval_ms (50) plus one such sleep.
constexpr int kMaxIdleSleepMs = 32;
}  // namespace

void SessionWriter::thread_main() {
    Impl& w = *impl_;
    const WriterOptions& o = options_;
    // Telemetry leaves the space reserve free (space_reserve.h); final summaries may use part.
    KeepFree keep(kTelemetryReserveBytes);
    int idle_passes = 0;
    for (;;) {
        std::vector<Request> reqs;
        bool stop = false;
        {
            std::lock_guard<std::mutex> lk(mu_);
            reqs.swap(requests_);
            stop = stop_;
        }
        const auto busy_start = Clock::now();
        std::vector<std::pair<uint64_t, std::string>> errors;
        std::vector<std::pair<uint64_t, WriterRunStats>> results;
        size_t n = 0;
        try {
            // Attaches first, so a flush queued after an attach covers that run.
            for (const Request& r : reqs) {
                if (r.kind != Request::ATTACH) continue;
                bool dup = false;
                for (auto& s : w.runs) dup |= s->id == r.run_id;
                if (dup) {
                    errors.push_back(
                        {r.seq, str("session '", path_, "': run ", r.run_id, " is already attached to the writer")});
                    continue;
                }
                try {
                    w.get_t0.bind(1, r.run_id);
                    bool found = w.get_t0.step();
                    int64_t t0 = found ? w.get_t0.i64(0) : 0;
                    w.get_t0.reset();
                    if (!found) {
                        errors.push_back(
                            {r.seq, str("session '", path_, "' has no run ", r.run_id, " to write events for")});
                        continue;
                    }
                    auto slot = std::make_unique<RunSlot>();
                    slot->id = r.run_id;
                    slot->recorder = r.recorder;
                    slot->t0_ns = t0;
                    // A run attached again (resumed training) continues its memory state.
                    slot->blocks.resume(memory_state_after(*w.db, r.run_id));
                    w.runs.push_back(std::move(slot));
                } catch (const std::exception& e) {
                    errors.push_back({r.seq, e.what()});
                }
            }
            n = w.drain_all(o);
            for (const Request& r : reqs) {
                if (r.kind == Request::FLUSH) {
                    for (auto& s : w.runs) w.drain_until_empty(*s, o);
                    w.commit(o, false);
                } else if (r.kind == Request::DETACH) {
                    RunSlot* slot = nullptr;
                    for (auto& s : w.runs)
                        if (s->id == r.run_id) slot = s.get();
                    if (!slot) {
                        errors.push_back(
                            {r.seq, str("session '", path_, "': run ", r.run_id, " is not attached to the writer")});
                        continue;
                    }
                    w.drain_until_empty(*slot, o);
                    w.commit(o, false);
                    // The final summary in a transaction of its own, so it reflects every commit.
                    try {
                        KeepFree end(kEndRecordReserveBytes);
                        w.ensure_txn();
                        w.write_progress(*slot);
                        w.write_summary(*slot);
                        w.commit(o, false);
                    } catch (const std::exception& e) {
                        w.last_error = Impl::fault_text(e);
                        w.rollback();
                    }
                    WriterRunStats st;
                    st.run_id = slot->id;
                    st.written = slot->written;
                    st.rows = slot->rows;
                    st.lost = slot->lost;
                    st.recorder = slot->recorder->stats();
                    st.error = w.last_error;
                    results.push_back({r.seq, std::move(st)});
                    for (auto it = w.runs.begin(); it != w.runs.end(); ++it)
                        if (it->get() == slot) {
                            w.runs.erase(it);
                            break;
                        }
                }
            }
            if (stop) {
                for (auto& s : w.runs) w.drain_until_empty(*s, o);
                w.commit(o, false);
                if (!w.runs.empty()) {
                    try {
                        KeepFree end(kEndRecordReserveBytes);
                        w.ensure_txn();
                        for (auto& s : w.runs) {
                            w.write_progress(*s);
                            w.write_summary(*s);
                        }
                        w.commit(o, false);
                    } catch (const std::exception& e) {
                        w.last_error = Impl::fault_text(e);
                        w.rollback();
                    }
                }
                // Fold the WAL back when nobody reads; harmless (and skipped) otherwise.
                sqlite3_wal_checkpoint_v2(w.db->handle(), nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
            }
        } catch (const std::exception& e) {
            // Nothing above is expected to throw (SQLite errors are caught per batch); this keeps
            // the thread alive and every caller answered if something does (e.g. bad_alloc).
            w.last_error = Impl::fault_text(e);
            if (w.in_txn) w.rollback();
            for (const Request& r : reqs) {
                bool answered = false;
                for (auto& x : results) answered |= x.first == r.seq;
                for (auto& x : errors) answered |= x.first == r.seq;
                if (!answered && r.kind != Request::FLUSH) errors.push_back({r.seq, str("session writer: ", e.what())});
            }
        }
        w.stats.busy_seconds += seconds_since(busy_start);
        w.stats.cpu_seconds = thread_cpu_seconds();
        {
            std::lock_guard<std::mutex> lk(mu_);
            stats_ = w.stats;
            stats_.error = w.last_error;
            for (auto& e : errors) request_errors_.push_back(std::move(e));
            for (auto& r : results) detach_results_.push_back(std::move(r));
            for (const Request& r : reqs) done_seq_ = std::max(done_seq_, r.seq);
        }
        if (!reqs.empty()) done_cv_.notify_all();
        if (stop) return;
        // Passes in a row that found nothing: the poll period doubles with each, up to
        // kMaxIdleSleepMs, and drops back to idle_sleep_ms with the first event.
        idle_passes = n == 0 && reqs.empty() ? idle_passes + 1 : 0;
        if (n < kBusyThreshold && reqs.empty()) {
            // Quiet: commit what is pending once it is due, then sleep briefly. Producers never
            // signal (they must not make syscalls), so the writer polls; under load (a drain
            // returns many events) it loops without sleeping.
            if (w.commit_due(o)) w.commit(o, false);
            const int sleep_ms = std::min(std::max(kMaxIdleSleepMs, o.idle_sleep_ms), o.idle_sleep_ms << std::min(idle_passes, 4));
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait_for(lk, std::chrono::milliseconds(sleep_ms), [&] { return stop_ || !requests_.empty(); });
        }
    }
}

}  // namespace kv::storage
