// The telemetry event model: fixed-size POD records selected by a uint8_t EventType, exactly
// what producers push through the per-thread queues and what the storage writer turns into rows.
// Records must stay trivially copyable and at most 64 bytes; anything variable-sized (replay
// logs, score arrays, log text, GPU batches) travels as an owned heap payload pointer.
// No SQLite, no Qt, no allocation tracking here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/memory/mem_category.h"
#include "engine/telemetry/gpu_records.h"
#include "kernels/common/tensor_view.h"

namespace kv::trace {

// =========================================================================================
// Enums (names are stable: they are stored in session files and exports)
// =========================================================================================
enum class EventType : uint8_t {
    SPAN = 0,    // a timed region on one thread
    ALLOC,       // one tracked-allocator event (signed bytes, running totals)
    CACHE_STEP,  // per (layer, chunk): replay-log blob written by the KV cache
    SCORES,      // per (layer, chunk): score summary, plus the full (B, G, T) array at intervals
    CELL,        // one finished cell of the gradient pipeline
    METRIC,      // (name, step, value)
    LOG,         // a log line
    PROGRESS,    // tokens/chunks/steps done and total
    GPU_BATCH,   // CUPTI activity records delivered in one buffer
    COUNT
};
constexpr size_t kNumEventTypes = size_t(EventType::COUNT);
const char* event_type_name(EventType t);

enum class SpanCategory : uint8_t {
    RUN = 0,
    CELL,
    LAYER,
    CHUNK,
    ATTENTION,
    MLP,
    NORM,
    CACHE_UPDATE,
    SCORING,
    QUANTIZE,
    DEQUANTIZE,
    CHECKPOINT_COPY,
    HEAD,
    BACKWARD,
    OPTIMIZER,
    IO,
    OTHER,
    COUNT
};
constexpr size_t kNumSpanCategories = size_t(SpanCategory::COUNT);
// "run", "cell", "layer", ..., "other"; "unknown" out of range.
const char* span_category_name(SpanCategory c);
// Inverse of span_category_name; throws kv::Error listing the valid names.
SpanCategory span_category_from_name(const std::string& name);

enum class LogLevel : uint8_t { DEBUG = 0, INFO, WARNING, ERROR, COUNT };
constexpr size_t kNumLogLevels = size_t(LogLevel::COUNT);
const char* log_level_name(LogLevel l);

// Devices are stored as one signed byte: -1 = cpu, n >= 0 = cuda:n.
inline int8_t device_code(Device d) { return d.is_cpu() ? int8_t(-1) : int8_t(d.index); }
inline Device device_from_code(int code) { return code < 0 ? Device{} : Device{DeviceType::CUDA, code}; }
std::string device_code_name(int code);  // "cpu", "cuda:0"

// =========================================================================================
// Payloads (heap objects owned by the event that carries them)
// =========================================================================================
// Summary statistics of one score array; quantiles are exact up to 65536 values and taken
// from an evenly strided sample beyond that (see score_stats.h).
struct ScoreStats {
    int64_t count = 0;      // finite values
    int64_t nonfinite = 0;  // NaN / inf values (excluded from the statistics)
    float min = 0, max = 0, mean = 0, stddev = 0;
    float p10 = 0, p50 = 0, p90 = 0, p99 = 0;
};

struct ScorePayload {
    int32_t B = 0, G = 0, T = 0;  // shape of the score array (batch, KV heads, slots)
    ScoreStats stats;
    std::vector<float> values;  // (B, G, T) row-major; empty when only the summary was kept
};

struct GpuBatchPayload {
    std::vector<GpuKernel> kernels;
    std::vector<GpuMemcpy> memcpys;
    std::vector<GpuMemset> memsets;
    std::vector<GpuMemory> memory;
    std::vector<GpuCorrelation> correlations;
    uint64_t dropped = 0;  // records CUPTI reported as dropped for this buffer
    size_t size() const {
        return kernels.size() + memcpys.size() + memsets.size() + memory.size() + correlations.size();
    }
};

// =========================================================================================
// Records. Every record starts with `EventType type`, so Event::type() can read it whatever
// the active member (common initial sequence of standard-layout structs).
// Conventions: -1 = "not applicable" for layer/chunk/cell/row/col; times are kv::now_ns().
// =========================================================================================
struct EventHeader {
    EventType type;
};

struct SpanRecord {
    EventType type;  // SPAN
    SpanCategory category;
    int8_t device;  // device_code()
    uint8_t reserved;
    uint32_t name_id;  // intern() id
    uint64_t start_ns;
    uint64_t end_ns;
    int32_t layer, chunk;
    int32_t cell_row, cell_col;
    uint32_t thread;          // thread_index()
    int32_t stream;           // engine stream index (0 = default)
    uint64_t correlation_id;  // external correlation id pushed to CUPTI (0 = none)
};

enum AllocFlags : uint8_t {
    ALLOC_FLAGS_NONE = 0,
    // Synthetic record emitted when a sink attaches: bytes = 0, totals = what the tracker held
    // already, so exports that sum categories match the allocator from the first event on.
    ALLOC_FLAGS_BASELINE = 1,
    // The allocation (or its release) is instrumentation: it measures the run (fidelity's
    // shadow cache, dense reference and KL passes), apart from the run's own memory.
    ALLOC_FLAGS_INSTRUMENTATION = 2,
};

struct AllocRecord {
    EventType type;  // ALLOC
    MemCategory category;
    int8_t device;
    uint8_t flags;      // AllocFlags
    uint32_t label_id;  // intern() id of the allocation label
    uint64_t t_ns;
    int64_t bytes;  // > 0 allocation, < 0 release, 0 baseline
    uint64_t address;
    uint64_t alloc_id;       // the same for an allocation and its release
    int64_t category_total;  // bytes of (device, category) after this event
    int64_t device_total;    // bytes on the device after this event
    int32_t layer, chunk;    // innermost enclosing span's layer/chunk on the allocating thread
};

struct CacheStepRecord {
    EventType type;  // CACHE_STEP
    uint8_t pass;    // 0 = first forward; the gradient pipeline's replays use 1, 2, ...
    uint8_t reserved[2];
    int32_t layer;
    int32_t chunk;
    int32_t num_tokens;    // tokens written by this step
    int64_t input_pos;     // position of the chunk's first token
    int32_t cache_length;  // cache slots in use after the step
    int32_t reserved2;
    uint64_t t_ns;
    std::vector<uint8_t>* replay_log;  // owned; encoding belongs to the KV-cache code
};

struct ScoresRecord {
    EventType type;  // SCORES
    uint8_t pass;
    uint8_t full;  // 1 when payload->values holds the full array
    uint8_t reserved;
    int32_t layer;
    int32_t chunk;
    int32_t reserved2;
    uint64_t t_ns;
    ScorePayload* payload;  // owned
};

struct CellRecord {
    EventType type;  // CELL
    int8_t device;
    uint8_t reserved[2];
    int32_t row, col;
    int32_t layer_begin, layer_end;  // [begin, end)
    int32_t chunk_begin, chunk_end;  // [begin, end)
    uint64_t start_ns, end_ns;
    int64_t peak_bytes;
};

struct MetricRecord {
    EventType type;  // METRIC
    uint8_t reserved[3];
    uint32_t name_id;
    int64_t step;
    double value;
    uint64_t t_ns;
};

struct LogRecord {
    EventType type;  // LOG
    LogLevel level;
    uint8_t reserved[2];
    uint32_t thread;
    uint64_t t_ns;
    std::string* text;  // owned
};

struct ProgressRecord {
    EventType type;  // PROGRESS
    uint8_t reserved[7];
    uint64_t t_ns;
    int64_t tokens_done, tokens_total;
    int32_t chunks_done, chunks_total;
    int32_t steps_done, steps_total;
};

struct GpuBatchRecord {
    EventType type;  // GPU_BATCH
    uint8_t reserved[7];
    uint64_t t_ns;
    GpuBatchPayload* payload;  // owned
};

struct Event {
    union {
        EventHeader hdr;
        SpanRecord span;
        AllocRecord alloc;
        CacheStepRecord cache_step;
        ScoresRecord scores;
        CellRecord cell;
        MetricRecord metric;
        LogRecord log;
        ProgressRecord progress;
        GpuBatchRecord gpu;
    };
    EventType type() const { return hdr.type; }
};

// One cache line per event: the queues copy whole records, and a record never straddles two
// lines when the ring buffer is 64-byte aligned.
constexpr size_t kEventSize = 64;
static_assert(sizeof(Event) == kEventSize, "Event must stay one cache line");
static_assert(std::is_trivially_copyable_v<Event>, "events are copied with memcpy semantics");
static_assert(std::is_standard_layout_v<SpanRecord> && std::is_standard_layout_v<AllocRecord> &&
                  std::is_standard_layout_v<CacheStepRecord> && std::is_standard_layout_v<ScoresRecord> &&
                  std::is_standard_layout_v<CellRecord> && std::is_standard_layout_v<MetricRecord> &&
                  std::is_standard_layout_v<LogRecord> && std::is_standard_layout_v<ProgressRecord> &&
                  std::is_standard_layout_v<GpuBatchRecord>,
              "records share the EventType prefix only if they are standard layout");

// Size of each record, indexed by EventType (the bytes of an Event that carry data).
inline constexpr size_t kEventRecordSize[] = {
    sizeof(SpanRecord),   sizeof(AllocRecord), sizeof(CacheStepRecord), sizeof(ScoresRecord),   sizeof(CellRecord),
    sizeof(MetricRecord), sizeof(LogRecord),   sizeof(ProgressRecord),  sizeof(GpuBatchRecord),
};
static_assert(sizeof(kEventRecordSize) / sizeof(kEventRecordSize[0]) == kNumEventTypes,
              "record size table out of date with EventType");
constexpr bool records_fit() {
    for (size_t s : kEventRecordSize)
        if (s > kEventSize) return false;
    return true;
}
static_assert(records_fit(), "a record grew beyond one cache line; move fields to a payload");

// True for records that own a heap payload.
bool event_has_payload(EventType t);
// Deletes the payload an event owns (if any) and clears the pointer.
void event_free_payload(Event& ev);

}  // namespace kv::trace
