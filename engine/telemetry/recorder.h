// A run's event recorder: bounded per-thread queues that producers push into without blocking,
// drained by one consumer at a time (the storage writer, or a test). It only moves events; it
// does not interpret them, write files or know about SQLite. Producers reach it through the
// thread-local scope in trace.h, the allocator through RecorderAllocSink, GPU records through
// GpuTracer.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/telemetry/event_queue.h"
#include "engine/telemetry/event_types.h"

namespace kv::trace {

struct RecorderOptions {
    // Events per producer thread (64 bytes each; 65536 = 4 MiB). A full queue drops events.
    size_t queue_capacity = size_t(1) << 16;
    // Keep the full (B, G, T) score array every `score_interval` chunks (chunk % interval == 0);
    // summaries are kept for every chunk. The driver sets 1 for tiny models (see
    // default_score_interval), 8 is the default for everything else.
    int score_interval = 8;
};

// Default score interval for a model: every chunk for tiny models, every 8th otherwise.
inline int default_score_interval(bool tiny_model) { return tiny_model ? 1 : 8; }

struct RecorderStats {
    std::array<uint64_t, kNumEventTypes> pushed{};   // queued
    std::array<uint64_t, kNumEventTypes> dropped{};  // lost to full queues
    uint64_t gpu_dropped = 0;                        // activity records CUPTI itself reported as dropped
    size_t queues = 0;                               // producer threads seen
    size_t pending = 0;                              // queued but not yet drained
    uint64_t total_pushed() const;
    uint64_t total_dropped() const;
};

// Receives drained events. The payload an event carries is freed by the Recorder after
// on_event returns, unless the sink clears the pointer (taking ownership).
class EventSink {
   public:
    virtual ~EventSink() = default;
    virtual void on_event(Event& ev) = 0;
};

class Recorder {
   public:
    explicit Recorder(const RecorderOptions& options = {});
    ~Recorder();  // frees payloads of undrained events; producers must be finished
    Recorder(const Recorder&) = delete;
    Recorder& operator=(const Recorder&) = delete;

    const RecorderOptions& options() const { return options_; }
    // Unique for the process lifetime (never reused, unlike the address).
    uint64_t uid() const { return uid_; }

    // ---- producers (any thread) --------------------------------------------------------
    // Queues `ev` on the calling thread's queue. Never blocks. Takes ownership of the
    // payload; if the queue is full the event is dropped, counted and its payload freed.
    bool push(Event& ev);
    // Whether a SCORES event for `chunk` keeps the full array.
    bool wants_full_scores(int chunk) const {
        return options_.score_interval <= 1 || (chunk >= 0 && chunk % options_.score_interval == 0);
    }
    // Ids for CUPTI external correlation (unique within this recorder, never 0).
    uint64_t next_correlation_id() { return next_correlation_.fetch_add(1, std::memory_order_relaxed); }
    void add_gpu_dropped(uint64_t n) { gpu_dropped_.fetch_add(n, std::memory_order_relaxed); }

    // ---- consumer (one thread at a time) -----------------------------------------------
    // Hands up to `max_events` queued events to `sink`, thread by thread in push order.
    size_t drain(EventSink& sink, size_t max_events = SIZE_MAX);
    // Discards everything queued (payloads freed).
    size_t discard();

    RecorderStats stats() const;

   private:
    EventQueue* queue_for_this_thread();
    EventQueue* register_thread();

    static constexpr size_t kMaxQueues = 1024;
    RecorderOptions options_;
    uint64_t uid_;
    std::mutex register_mu_;  // only taken when a thread pushes to this recorder the first time
    std::array<std::atomic<EventQueue*>, kMaxQueues> queues_{};
    std::atomic<size_t> num_queues_{0};
    std::vector<std::unique_ptr<EventQueue>> owned_;                        // guarded by register_mu_
    std::array<std::atomic<uint64_t>, kNumEventTypes> unqueued_dropped_{};  // threads beyond kMaxQueues
    std::atomic<uint64_t> gpu_dropped_{0};
    std::atomic<uint64_t> next_correlation_{1};
    std::mutex drain_mu_;     // one consumer at a time
    size_t drain_start_ = 0;  // guarded by drain_mu_
};

// Small sequential id of the calling thread (1, 2, ...), stable for its lifetime.
uint32_t thread_index();

}  // namespace kv::trace
