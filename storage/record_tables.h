// The column tables of the event records (storage/columns.h): cache steps, cells and the CUPTI
// activity tables. Each column is named, typed, bound and decoded here once; schema.cpp creates
// the tables from them, the writer inserts through them, readers select through them.
// Times, -1 conventions and the CUPTI naming are explained at the DDL in schema.cpp.
#pragma once

#include <string_view>

#include "engine/telemetry/event_types.h"
#include "storage/columns.h"
#include "storage/rows.h"
#include "storage/run_info.h"

namespace kv::storage::tables {

// What the writer binds from: the record and its run (plus the process id and resolved string
// ids where a table stores them).
struct SpanWrite {
    int64_t run, name;
    const trace::SpanRecord& s;
};
struct MemoryEventWrite {
    int64_t run, label;
    const trace::AllocRecord& a;
};
// What a reader decodes spans and memory events into: the row, and the StringIds id of its
// name or label, which the reader resolves (SessionReader's string cache).
struct SpanRead {
    SpanRow row;
    int64_t name_id = 0;
};
struct MemoryEventRead {
    MemoryEventRow row;
    int64_t label_id = 0;
};
// What a reader decodes a runs row into: the RunInfo, plus the columns it maps or checks itself
// (the status name, the owner's identity).
struct RunRead {
    RunInfo info;
    std::string status, owner_boot;
    int64_t owner_start = 0;
};
struct NoWrite {};  // tables whose rows the event writer does not insert
struct CacheStepWrite {
    int64_t run;
    const trace::CacheStepRecord& c;
};
struct ScoreWrite {
    int64_t run;
    const trace::ScoresRecord& s;
    const trace::ScorePayload& p;
};
struct CellWrite {
    int64_t run;
    const trace::CellRecord& c;
};
struct KernelWrite {
    int64_t run, pid, demangled_name, short_name;
    const GpuKernel& k;
};
struct MemcpyWrite {
    int64_t run, pid;
    const GpuMemcpy& c;
};
struct MemsetWrite {
    int64_t run, pid;
    const GpuMemset& s;
};
struct MemoryWrite {
    int64_t run, pid, name;
    const GpuMemory& m;
};
struct MetricWrite {
    int64_t run;
    std::string_view name;
    const trace::MetricRecord& m;
};
struct LogWrite {
    int64_t run;
    std::string_view text;
    const trace::LogRecord& l;
};
struct CorrelationWrite {
    int64_t run;
    const GpuCorrelation& x;
};
struct NoRow {};  // tables no reader decodes through their column table (yet)

inline const auto& cache_steps() {
    using W = CacheStepWrite;
    using R = CacheStepRow;
    static const Column<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.id = s.i64(i); }},
        {"run_id", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.run); }, nullptr},
        {"layer", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.layer); }, [](const Stmt& s, int i, R& r) { r.layer = s.i32(i); }},
        {"chunk", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.chunk); }, [](const Stmt& s, int i, R& r) { r.chunk = s.i32(i); }},
        {"pass", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, int(w.c.pass)); }, [](const Stmt& s, int i, R& r) { r.pass = s.i32(i); }},
        {"t_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.t_ns); }, [](const Stmt& s, int i, R& r) { r.t_ns = s.i64(i); }},
        {"input_pos", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.input_pos); },
         [](const Stmt& s, int i, R& r) { r.input_pos = s.i64(i); }},
        {"num_tokens", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.num_tokens); },
         [](const Stmt& s, int i, R& r) { r.num_tokens = s.i32(i); }},
        {"cache_length", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.cache_length); },
         [](const Stmt& s, int i, R& r) { r.cache_length = s.i32(i); }},
        {"replay_log", "BLOB",
         [](Stmt& q, int i, const W& w) {
             const std::vector<uint8_t>* log = w.c.replay_log;
             q.bind_blob(i, log ? log->data() : nullptr, log ? log->size() : 0);
         },
         [](const Stmt& s, int i, R& r) {
             const auto* p = static_cast<const uint8_t*>(s.blob(i));
             r.replay_log.assign(p, p + s.bytes(i));
         }},
    };
    static const auto t = make_table("cache_steps", cols);
    return t;
}

// runs: one row per run, inserted and updated column by column by Session (session.cpp), so
// the table gives its DDL and its decoding only. Migration 2 -> 3 rebuilds it from here.
inline const auto& runs() {
    using W = NoWrite;
    using R = RunRead;
#define KV_RUN(name, type, expr) \
    { name, type, nullptr, [](const Stmt& s, int i, R& r) { expr; } }
    static const Column<W, R> cols[] = {
        KV_RUN("id", "INTEGER PRIMARY KEY", r.info.id = s.i64(i)),
        KV_RUN("name", "TEXT NOT NULL", r.info.name = s.text(i)),
        KV_RUN("config", "TEXT NOT NULL DEFAULT '{}'", r.info.config = s.text(i)),
        KV_RUN("status",
               "TEXT NOT NULL CHECK(status IN ('queued','running','done','failed','cancelled','crashed','degraded'))",
               r.status = s.text(i)),
        KV_RUN("created_ms", "INTEGER NOT NULL", r.info.created_ms = s.i64(i)),
        KV_RUN("started_ms", "INTEGER", r.info.started_ms = s.i64(i)),
        KV_RUN("finished_ms", "INTEGER", r.info.finished_ms = s.i64(i)),
        KV_RUN("t0_ns", "INTEGER", r.info.t0_ns = s.i64(i)),
        KV_RUN("tokens_done", "INTEGER NOT NULL DEFAULT 0", r.info.progress.tokens_done = s.i64(i)),
        KV_RUN("tokens_total", "INTEGER NOT NULL DEFAULT 0", r.info.progress.tokens_total = s.i64(i)),
        KV_RUN("chunks_done", "INTEGER NOT NULL DEFAULT 0", r.info.progress.chunks_done = s.i32(i)),
        KV_RUN("chunks_total", "INTEGER NOT NULL DEFAULT 0", r.info.progress.chunks_total = s.i32(i)),
        KV_RUN("steps_done", "INTEGER NOT NULL DEFAULT 0", r.info.progress.steps_done = s.i32(i)),
        KV_RUN("steps_total", "INTEGER NOT NULL DEFAULT 0", r.info.progress.steps_total = s.i32(i)),
        KV_RUN("progress_ms", "INTEGER", r.info.progress.updated_ms = s.i64(i)),
        KV_RUN("host", "TEXT", r.info.host = s.text(i)),
        KV_RUN("build", "TEXT", r.info.build = s.text(i)),
        KV_RUN("error", "TEXT", r.info.error = s.text(i)),
        KV_RUN("owner_pid", "INTEGER", r.info.owner_pid = s.i64(i)),
        KV_RUN("owner_start", "INTEGER", r.owner_start = s.i64(i)),
        KV_RUN("owner_boot", "TEXT", r.owner_boot = s.text(i)),
        KV_RUN("owner_host", "TEXT", r.info.owner_host = s.text(i)),
        KV_RUN("summary", "TEXT NOT NULL DEFAULT '{}'", r.info.summary = s.text(i)),
    };
#undef KV_RUN
    static const auto t = make_table("runs", cols);
    return t;
}

// Duration class of a span: 0 for zero length, else the bit length of the duration, so every
// span of class c lasts less than 2^c ns (see SessionReader::spans for the window query).
inline int64_t span_dur_class(uint64_t start, uint64_t end) {
    uint64_t d = end > start ? end - start : 0;
    return d == 0 ? 0 : 64 - __builtin_clzll(d);
}

// spans and memory_events: integer columns, written through BatchedInsert (the block-range
// indexes of storage/event_blocks.h cover their ids).
inline const auto& spans() {
    using W = SpanWrite;
    using R = SpanRead;
    static const IntColumn<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.row.id = s.i64(i); }},
        {"run_id", "INTEGER", [](const W& w) { return w.run; }, nullptr},
        {"start_ns", "INTEGER", [](const W& w) { return int64_t(w.s.start_ns); }, [](const Stmt& s, int i, R& r) { r.row.start_ns = s.i64(i); }},
        {"end_ns", "INTEGER", [](const W& w) { return int64_t(w.s.end_ns); }, [](const Stmt& s, int i, R& r) { r.row.end_ns = s.i64(i); }},
        {"dur_class", "INTEGER", [](const W& w) { return span_dur_class(w.s.start_ns, w.s.end_ns); }, nullptr},
        {"name_id", "INTEGER", [](const W& w) { return w.name; }, [](const Stmt& s, int i, R& r) { r.name_id = s.i64(i); }},
        {"category", "INTEGER", [](const W& w) { return int64_t(w.s.category); },
         [](const Stmt& s, int i, R& r) {
             int c = s.i32(i);
             r.row.category = c >= 0 && size_t(c) < trace::kNumSpanCategories ? trace::SpanCategory(c) : trace::SpanCategory::OTHER;
         }},
        {"layer", "INTEGER", [](const W& w) { return int64_t(w.s.layer); }, [](const Stmt& s, int i, R& r) { r.row.layer = s.i32(i); }},
        {"chunk", "INTEGER", [](const W& w) { return int64_t(w.s.chunk); }, [](const Stmt& s, int i, R& r) { r.row.chunk = s.i32(i); }},
        {"cell_row", "INTEGER", [](const W& w) { return int64_t(w.s.cell_row); }, [](const Stmt& s, int i, R& r) { r.row.cell_row = s.i32(i); }},
        {"cell_col", "INTEGER", [](const W& w) { return int64_t(w.s.cell_col); }, [](const Stmt& s, int i, R& r) { r.row.cell_col = s.i32(i); }},
        {"thread", "INTEGER", [](const W& w) { return int64_t(w.s.thread); }, [](const Stmt& s, int i, R& r) { r.row.thread = s.i32(i); }},
        {"device", "INTEGER", [](const W& w) { return int64_t(w.s.device); }, [](const Stmt& s, int i, R& r) { r.row.device = s.i32(i); }},
        {"stream", "INTEGER", [](const W& w) { return int64_t(w.s.stream); }, [](const Stmt& s, int i, R& r) { r.row.stream = s.i32(i); }},
        {"correlation_id", "INTEGER", [](const W& w) { return int64_t(w.s.correlation_id); },
         [](const Stmt& s, int i, R& r) { r.row.correlation_id = s.i64(i); }},
    };
    static const auto t = make_int_table("spans", cols);
    return t;
}

inline const auto& memory_events() {
    using W = MemoryEventWrite;
    using R = MemoryEventRead;
    static const IntColumn<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.row.id = s.i64(i); }},
        {"run_id", "INTEGER", [](const W& w) { return w.run; }, nullptr},
        {"t_ns", "INTEGER", [](const W& w) { return int64_t(w.a.t_ns); }, [](const Stmt& s, int i, R& r) { r.row.t_ns = s.i64(i); }},
        {"bytes", "INTEGER", [](const W& w) { return w.a.bytes; }, [](const Stmt& s, int i, R& r) { r.row.bytes = s.i64(i); }},
        {"category", "INTEGER", [](const W& w) { return int64_t(w.a.category); },
         [](const Stmt& s, int i, R& r) {
             int c = s.i32(i);
             r.row.category = c >= 0 && size_t(c) < kNumMemCategories ? MemCategory(c) : MemCategory::WORKSPACE;
         }},
        {"device", "INTEGER", [](const W& w) { return int64_t(w.a.device); }, [](const Stmt& s, int i, R& r) { r.row.device = s.i32(i); }},
        {"label_id", "INTEGER", [](const W& w) { return w.label; }, [](const Stmt& s, int i, R& r) { r.label_id = s.i64(i); }},
        {"alloc_id", "INTEGER", [](const W& w) { return int64_t(w.a.alloc_id); }, [](const Stmt& s, int i, R& r) { r.row.alloc_id = s.i64(i); }},
        {"address", "INTEGER", [](const W& w) { return int64_t(w.a.address); },
         [](const Stmt& s, int i, R& r) { r.row.address = uint64_t(s.i64(i)); }},
        {"category_total", "INTEGER", [](const W& w) { return w.a.category_total; },
         [](const Stmt& s, int i, R& r) { r.row.category_total = s.i64(i); }},
        {"device_total", "INTEGER", [](const W& w) { return w.a.device_total; },
         [](const Stmt& s, int i, R& r) { r.row.device_total = s.i64(i); }},
        {"layer", "INTEGER", [](const W& w) { return int64_t(w.a.layer); }, [](const Stmt& s, int i, R& r) { r.row.layer = s.i32(i); }},
        {"chunk", "INTEGER", [](const W& w) { return int64_t(w.a.chunk); }, [](const Stmt& s, int i, R& r) { r.row.chunk = s.i32(i); }},
        {"flags", "INTEGER", [](const W& w) { return int64_t(w.a.flags); }, [](const Stmt& s, int i, R& r) { r.row.flags = uint8_t(s.i32(i)); }},
    };
    static const auto t = make_int_table("memory_events", cols);
    return t;
}

// The summary statistics are NULL when no value was finite.
template <float trace::ScoreStats::*F>
void bind_score_stat(Stmt& q, int i, const ScoreWrite& w) {
    if (w.p.stats.count > 0)
        q.bind(i, double(w.p.stats.*F));
    else
        q.bind_null(i);
}
template <float trace::ScoreStats::*F>
void read_score_stat(const Stmt& s, int i, ScoreRow& r) {
    r.stats.*F = float(s.f64(i));
}
#define KV_STAT(name, field) \
    { name, "REAL", bind_score_stat<&trace::ScoreStats::field>, read_score_stat<&trace::ScoreStats::field> }

// scores: little-endian float32 (B, G, T) row-major, NULL when only the summary was kept. Readers
// select it themselves (with or without the array), after the table's columns.
inline const auto& score_snapshots() {
    using W = ScoreWrite;
    using R = ScoreRow;
    static const Column<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.id = s.i64(i); }},
        {"run_id", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.run); }, nullptr},
        {"layer", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.s.layer); }, [](const Stmt& s, int i, R& r) { r.layer = s.i32(i); }},
        {"chunk", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.s.chunk); }, [](const Stmt& s, int i, R& r) { r.chunk = s.i32(i); }},
        {"pass", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, int(w.s.pass)); }, [](const Stmt& s, int i, R& r) { r.pass = s.i32(i); }},
        {"t_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.s.t_ns); }, [](const Stmt& s, int i, R& r) { r.t_ns = s.i64(i); }},
        {"B", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.p.B); }, [](const Stmt& s, int i, R& r) { r.B = s.i32(i); }},
        {"G", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.p.G); }, [](const Stmt& s, int i, R& r) { r.G = s.i32(i); }},
        {"T", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.p.T); }, [](const Stmt& s, int i, R& r) { r.T = s.i32(i); }},
        {"count", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.p.stats.count); },
         [](const Stmt& s, int i, R& r) { r.stats.count = s.i64(i); }},
        {"nonfinite", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.p.stats.nonfinite); },
         [](const Stmt& s, int i, R& r) { r.stats.nonfinite = s.i64(i); }},
        KV_STAT("min", min), KV_STAT("max", max), KV_STAT("mean", mean), KV_STAT("stddev", stddev),
        KV_STAT("p10", p10), KV_STAT("p50", p50), KV_STAT("p90", p90), KV_STAT("p99", p99),
        // float32 in host order; every platform kvlab builds for is little-endian.
        {"scores", "BLOB",
         [](Stmt& q, int i, const W& w) {
             if (w.s.full && !w.p.values.empty())
                 q.bind_blob(i, w.p.values.data(), w.p.values.size() * sizeof(float));
             else
                 q.bind_null(i);
         },
         nullptr},
    };
    static const auto t = make_table("score_snapshots", cols);
    return t;
}
#undef KV_STAT

inline const auto& cells() {
    using W = CellWrite;
    using R = CellRow;
    static const Column<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.id = s.i64(i); }},
        {"run_id", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.run); }, nullptr},
        {"row", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.row); }, [](const Stmt& s, int i, R& r) { r.row = s.i32(i); }},
        {"col", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.col); }, [](const Stmt& s, int i, R& r) { r.col = s.i32(i); }},
        {"layer_begin", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.layer_begin); },
         [](const Stmt& s, int i, R& r) { r.layer_begin = s.i32(i); }},
        {"layer_end", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.layer_end); },
         [](const Stmt& s, int i, R& r) { r.layer_end = s.i32(i); }},
        {"chunk_begin", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.chunk_begin); },
         [](const Stmt& s, int i, R& r) { r.chunk_begin = s.i32(i); }},
        {"chunk_end", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.chunk_end); },
         [](const Stmt& s, int i, R& r) { r.chunk_end = s.i32(i); }},
        {"start_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.start_ns); },
         [](const Stmt& s, int i, R& r) { r.start_ns = s.i64(i); }},
        {"end_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.end_ns); }, [](const Stmt& s, int i, R& r) { r.end_ns = s.i64(i); }},
        {"peak_bytes", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.c.peak_bytes); },
         [](const Stmt& s, int i, R& r) { r.peak_bytes = s.i64(i); }},
        {"device", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, int(w.c.device)); }, [](const Stmt& s, int i, R& r) { r.device = s.i32(i); }},
    };
    static const auto t = make_table("cells", cols);
    return t;
}

inline const auto& metrics() {
    using W = MetricWrite;
    using R = MetricRow;
    static const Column<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.id = s.i64(i); }},
        {"run_id", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.run); }, nullptr},
        {"name", "TEXT", [](Stmt& q, int i, const W& w) { q.bind(i, w.name); }, [](const Stmt& s, int i, R& r) { r.name = s.text(i); }},
        {"step", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.m.step); }, [](const Stmt& s, int i, R& r) { r.step = s.i64(i); }},
        {"value", "REAL", [](Stmt& q, int i, const W& w) { q.bind(i, w.m.value); },
         // SQLite stores NaN as NULL.
         [](const Stmt& s, int i, R& r) { r.value = s.is_null(i) ? 0.0 : s.f64(i); }},
        {"t_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.m.t_ns); }, [](const Stmt& s, int i, R& r) { r.t_ns = s.i64(i); }},
    };
    static const auto t = make_table("metrics", cols);
    return t;
}

inline const auto& logs() {
    using W = LogWrite;
    using R = LogRow;
    static const Column<W, R> cols[] = {
        {"id", "INTEGER PRIMARY KEY", nullptr, [](const Stmt& s, int i, R& r) { r.id = s.i64(i); }},
        {"run_id", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.run); }, nullptr},
        {"t_ns", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.l.t_ns); }, [](const Stmt& s, int i, R& r) { r.t_ns = s.i64(i); }},
        {"level", "TEXT", [](Stmt& q, int i, const W& w) { q.bind(i, trace::log_level_name(w.l.level)); },
         [](const Stmt& s, int i, R& r) { r.level = s.text(i); }},
        {"thread", "INTEGER", [](Stmt& q, int i, const W& w) { q.bind(i, w.l.thread); }, [](const Stmt& s, int i, R& r) { r.thread = s.i32(i); }},
        {"text", "TEXT", [](Stmt& q, int i, const W& w) { q.bind(i, w.text); }, [](const Stmt& s, int i, R& r) { r.text = s.text(i); }},
    };
    static const auto t = make_table("logs", cols);
    return t;
}

// The CUPTI activity tables keep Nsight Systems' export names and columns (plus run_id); every
// column is NOT NULL. Readers join them (SessionReader::gpu_activity), so no row decoding here.
#define KV_NN "INTEGER NOT NULL"
#define KV_COL(name, expr) \
    { name, KV_NN, [](Stmt& q, int i, const W& w) { q.bind(i, expr); }, nullptr }

inline const auto& cupti_kernel() {
    using W = KernelWrite;
    static const Column<W, NoRow> cols[] = {
        KV_COL("run_id", w.run), KV_COL("start", w.k.start), KV_COL("\"end\"", w.k.end),
        KV_COL("deviceId", w.k.device_id), KV_COL("contextId", w.k.context_id), KV_COL("streamId", w.k.stream_id),
        KV_COL("correlationId", w.k.correlation_id), KV_COL("globalPid", w.pid),
        KV_COL("demangledName", w.demangled_name), KV_COL("shortName", w.short_name),
        KV_COL("launchType", int(w.k.launch_type)), KV_COL("cacheConfig", int(w.k.cache_config)),
        KV_COL("registersPerThread", w.k.registers_per_thread),
        KV_COL("gridX", w.k.grid_x), KV_COL("gridY", w.k.grid_y), KV_COL("gridZ", w.k.grid_z),
        KV_COL("blockX", w.k.block_x), KV_COL("blockY", w.k.block_y), KV_COL("blockZ", w.k.block_z),
        KV_COL("staticSharedMemory", w.k.static_shared_memory), KV_COL("dynamicSharedMemory", w.k.dynamic_shared_memory),
        KV_COL("localMemoryPerThread", w.k.local_memory_per_thread), KV_COL("localMemoryTotal", w.k.local_memory_total),
        KV_COL("graphNodeId", w.k.graph_node_id), KV_COL("graphId", w.k.graph_id),
    };
    static const auto t = make_table("CUPTI_ACTIVITY_KIND_KERNEL", cols);
    return t;
}

inline const auto& cupti_memcpy() {
    using W = MemcpyWrite;
    static const Column<W, NoRow> cols[] = {
        KV_COL("run_id", w.run), KV_COL("start", w.c.start), KV_COL("\"end\"", w.c.end),
        KV_COL("deviceId", w.c.device_id), KV_COL("contextId", w.c.context_id), KV_COL("streamId", w.c.stream_id),
        KV_COL("correlationId", w.c.correlation_id), KV_COL("globalPid", w.pid),
        KV_COL("bytes", w.c.bytes), KV_COL("copyKind", int(w.c.copy_kind)), KV_COL("srcKind", int(w.c.src_kind)),
        KV_COL("dstKind", int(w.c.dst_kind)), KV_COL("flags", int(w.c.flags)), KV_COL("graphNodeId", w.c.graph_node_id),
    };
    static const auto t = make_table("CUPTI_ACTIVITY_KIND_MEMCPY", cols);
    return t;
}

inline const auto& cupti_memset() {
    using W = MemsetWrite;
    static const Column<W, NoRow> cols[] = {
        KV_COL("run_id", w.run), KV_COL("start", w.s.start), KV_COL("\"end\"", w.s.end),
        KV_COL("deviceId", w.s.device_id), KV_COL("contextId", w.s.context_id), KV_COL("streamId", w.s.stream_id),
        KV_COL("correlationId", w.s.correlation_id), KV_COL("globalPid", w.pid),
        KV_COL("value", w.s.value), KV_COL("bytes", w.s.bytes), KV_COL("memKind", int(w.s.mem_kind)),
        KV_COL("flags", int(w.s.flags)), KV_COL("graphNodeId", w.s.graph_node_id),
    };
    static const auto t = make_table("CUPTI_ACTIVITY_KIND_MEMSET", cols);
    return t;
}

// MEMORY2 records; nsys exports them (with --cuda-memory-usage) under this name.
inline const auto& cuda_memory_usage() {
    using W = MemoryWrite;
    static const Column<W, NoRow> cols[] = {
        KV_COL("run_id", w.run), KV_COL("start", w.m.start), KV_COL("globalPid", w.pid),
        KV_COL("deviceId", w.m.device_id), KV_COL("contextId", w.m.context_id), KV_COL("streamId", w.m.stream_id),
        KV_COL("correlationId", w.m.correlation_id), KV_COL("address", w.m.address), KV_COL("pc", w.m.pc),
        KV_COL("bytes", w.m.bytes), KV_COL("memKind", w.m.mem_kind), KV_COL("memoryOperationType", w.m.memory_operation_type),
        KV_COL("name", w.name), KV_COL("isAsync", w.m.is_async),
        KV_COL("localMemoryPoolAddress", w.m.pool_address), KV_COL("localMemoryPoolReleaseThreshold", w.m.pool_release_threshold),
        KV_COL("localMemoryPoolSize", w.m.pool_size), KV_COL("localMemoryPoolUtilizedSize", w.m.pool_utilized_size),
    };
    static const auto t = make_table("CUDA_GPU_MEMORY_USAGE_EVENTS", cols);
    return t;
}

// externalId = spans.correlation_id of the engine span that launched the work (CUSTOM0 = 3).
inline const auto& cupti_external_correlation() {
    using W = CorrelationWrite;
    static const Column<W, NoRow> cols[] = {
        KV_COL("run_id", w.run), KV_COL("externalKind", w.x.external_kind), KV_COL("externalId", w.x.external_id),
        KV_COL("correlationId", w.x.correlation_id),
    };
    static const auto t = make_table("CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION", cols);
    return t;
}

#undef KV_COL
#undef KV_NN

}  // namespace kv::storage::tables
