// The column tables of the event records (storage/columns.h): cache steps, cells and the CUPTI
// activity tables. Each column is named, typed, bound and decoded here once; schema.cpp creates
// the tables from them, the writer inserts through them, readers select through them.
// Times, -1 conventions and the CUPTI naming are explained at the DDL in schema.cpp.
#pragma once

#include "engine/telemetry/event_types.h"
#include "storage/columns.h"
#include "storage/rows.h"

namespace kv::storage::tables {

// What the writer binds from: the record and its run (plus the process id and resolved string
// ids where a table stores them).
struct CacheStepWrite {
    int64_t run;
    const trace::CacheStepRecord& c;
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

#undef KV_COL
#undef KV_NN

}  // namespace kv::storage::tables
