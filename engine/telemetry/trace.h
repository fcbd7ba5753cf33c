// The engine-facing tracing API: a thread-local "current recorder" (RecorderScope, like
// kv::MemoryTrackerScope) and free functions that record into it, so model, cache and gradient
// code never plumb a recorder through. With no recorder installed on the thread every call is
// a no-op costing one thread-local load. Nothing here blocks, throws on full queues, or touches
// storage.
//
//   static const trace::Name kAttention("attention");
//   auto s = trace::span(trace::SpanCategory::ATTENTION, kAttention, {.layer = l, .chunk = c});
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/memory/memory_tracker.h"
#include "engine/telemetry/event_types.h"
#include "engine/telemetry/recorder.h"
#include "engine/telemetry/string_table.h"

namespace kv::trace {

namespace detail {
// The recorder of this thread (nullptr: tracing off). constinit lets other translation units
// read it without a TLS wrapper call.
extern constinit thread_local Recorder* t_recorder;
// layer/chunk of the innermost span that set them, stamped on allocation records.
struct SpanContext {
    int32_t layer = -1;
    int32_t chunk = -1;
};
extern constinit thread_local SpanContext t_context;
// Set while the CUPTI tracer runs: spans then push external correlation ids.
extern std::atomic<bool> g_gpu_correlation;
void gpu_push_correlation(uint64_t id);
void gpu_pop_correlation();
}  // namespace detail

// ---- current recorder ---------------------------------------------------------------------
// Installs `recorder` as this thread's recorder for the lifetime of the scope (nestable).
class RecorderScope {
   public:
    explicit RecorderScope(Recorder& recorder) : prev_(detail::t_recorder) { detail::t_recorder = &recorder; }
    ~RecorderScope() { detail::t_recorder = prev_; }
    RecorderScope(const RecorderScope&) = delete;
    RecorderScope& operator=(const RecorderScope&) = delete;

   private:
    Recorder* prev_;
};

inline Recorder* current() { return detail::t_recorder; }
inline bool active() { return detail::t_recorder != nullptr; }

// ---- spans --------------------------------------------------------------------------------
struct SpanArgs {
    int32_t layer = -1;
    int32_t chunk = -1;
    int32_t cell_row = -1;
    int32_t cell_col = -1;
    Device device{};
    int32_t stream = 0;
};

// Times the enclosing C++ scope. ~2 clock reads and one queue push when recording; a single
// thread-local load otherwise. Not movable: bind it with `auto s = trace::span(...)`.
class SpanScope {
   public:
    SpanScope(SpanCategory category, Name name, const SpanArgs& args = {}) {
        if (Recorder* r = detail::t_recorder) begin(r, category, name.id, args);
    }
    SpanScope(SpanCategory category, std::string_view name, const SpanArgs& args = {}) {
        if (Recorder* r = detail::t_recorder) begin(r, category, intern(name), args);
    }
    ~SpanScope() {
        if (rec_) end();
    }
    SpanScope(const SpanScope&) = delete;
    SpanScope& operator=(const SpanScope&) = delete;

    // The id GPU work launched inside this span is tagged with (0 when CUPTI is off).
    uint64_t correlation_id() const { return rec_ ? span_.correlation_id : 0; }

   private:
    void begin(Recorder* r, SpanCategory category, uint32_t name_id, const SpanArgs& args);
    void end();

    Recorder* rec_ = nullptr;
    SpanRecord span_;
    detail::SpanContext saved_;
};

[[nodiscard]] inline SpanScope span(SpanCategory category, Name name, const SpanArgs& args = {}) {
    return SpanScope(category, name, args);
}
// Same with a name built at run time (interned on every call: prefer Name in hot loops).
[[nodiscard]] inline SpanScope span(SpanCategory category, std::string_view name, const SpanArgs& args = {}) {
    return SpanScope(category, name, args);
}
// Records a span measured elsewhere (start/end from kv::now_ns()).
void span_complete(SpanCategory category, Name name, uint64_t start_ns, uint64_t end_ns, const SpanArgs& args = {});

// ---- metrics, logs, progress --------------------------------------------------------------
void metric(Name name, int64_t step, double value);
void metric(std::string_view name, int64_t step, double value);
void log(LogLevel level, std::string_view text);

struct ProgressInfo {
    int64_t tokens_done = 0, tokens_total = 0;
    int32_t chunks_done = 0, chunks_total = 0;
    int32_t steps_done = 0, steps_total = 0;
};
void progress(const ProgressInfo& p);

// ---- KV cache -----------------------------------------------------------------------------
// One cache update of `layer` for `chunk`: the replay-log blob (encoding owned by the KV-cache
// code) plus where the chunk starts, how many tokens it wrote and the cache length after.
// `pass` 0 is the first forward; replays of the gradient pipeline use 1, 2, ...
void cache_step(int layer, int chunk, int64_t input_pos, int num_tokens, int cache_length,
                std::vector<uint8_t> replay_log, int pass = 0);

// Scores of `layer` after `chunk`: values (B, G, T) row-major, contiguous. The summary is
// recorded every call, the full array only when wants_full_scores(chunk).
void scores(int layer, int chunk, const float* values, int B, int G, int T, int pass = 0);
// Whether scores() for `chunk` would keep the full array (false with no recorder).
bool wants_full_scores(int chunk);

// ---- gradient pipeline cells --------------------------------------------------------------
struct CellInfo {
    int32_t row = -1, col = -1;
    int32_t layer_begin = 0, layer_end = 0;  // [begin, end)
    int32_t chunk_begin = 0, chunk_end = 0;  // [begin, end)
    uint64_t start_ns = 0, end_ns = 0;
    int64_t peak_bytes = 0;
    Device device{};
};
void cell(const CellInfo& c);

}  // namespace kv::trace

// Span over the rest of the enclosing scope with a name interned once per call site:
//   KV_TRACE_SPAN(kv::trace::SpanCategory::MLP, "mlp", .layer = l, .chunk = c);
#define KV_TRACE_CONCAT2(a, b) a##b
#define KV_TRACE_CONCAT(a, b) KV_TRACE_CONCAT2(a, b)
#define KV_TRACE_SPAN(category, name, ...)                                          \
    static const ::kv::trace::Name KV_TRACE_CONCAT(kv_trace_name_, __LINE__)(name); \
    ::kv::trace::SpanScope KV_TRACE_CONCAT(kv_trace_span_, __LINE__)(               \
        category, KV_TRACE_CONCAT(kv_trace_name_, __LINE__), ::kv::trace::SpanArgs{__VA_ARGS__})
