// A bounded single-producer / single-consumer ring of Events: one per producer thread per
// Recorder. The producer never blocks and never takes a lock; when the ring is full the event
// is dropped and counted (per event type), so tracing can slow a run down only by the cost of a
// copy. The consumer processes events in place and then releases the slots.
// Must not allocate after construction and must not be shared by two producers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "engine/telemetry/event_types.h"

namespace kv::trace {

class EventQueue {
   public:
    // capacity is rounded up to a power of two (at least 16).
    explicit EventQueue(size_t capacity, uint32_t thread) : thread_(thread) {
        size_t cap = 16;
        while (cap < capacity) cap <<= 1;
        buf_.reset(static_cast<Event*>(::operator new[](cap * sizeof(Event), std::align_val_t(64))));
        mask_ = cap - 1;
        for (auto& c : pushed_) c.store(0, std::memory_order_relaxed);
        for (auto& c : dropped_) c.store(0, std::memory_order_relaxed);
    }
    EventQueue(const EventQueue&) = delete;
    EventQueue& operator=(const EventQueue&) = delete;

    size_t capacity() const { return mask_ + 1; }
    uint32_t thread() const { return thread_; }

    // ---- producer side ------------------------------------------------------------------
    // False when full: the event was not queued and the drop was counted. The caller keeps
    // ownership of any payload in that case.
    bool try_push(const Event& ev) {
        const uint64_t head = head_.load(std::memory_order_relaxed);
        if (head - cached_tail_ > mask_) {
            cached_tail_ = tail_.load(std::memory_order_acquire);
            if (head - cached_tail_ > mask_) {
                bump(dropped_[size_t(ev.type())]);
                return false;
            }
        }
        buf_.get()[head & mask_] = ev;
        head_.store(head + 1, std::memory_order_release);
        bump(pushed_[size_t(ev.type())]);
        return true;
    }

    // ---- consumer side ------------------------------------------------------------------
    // Calls fn(Event&) for up to `max` queued events in push order, then frees their slots.
    // fn may take over a payload (it is the consumer's job to free it, see Recorder::drain).
    template <class Fn>
    size_t consume(Fn&& fn, size_t max) {
        const uint64_t tail = tail_.load(std::memory_order_relaxed);
        const uint64_t head = head_.load(std::memory_order_acquire);
        uint64_t n = head - tail;
        if (n > max) n = max;
        for (uint64_t i = 0; i < n; ++i) fn(buf_.get()[(tail + i) & mask_]);
        tail_.store(tail + n, std::memory_order_release);
        return size_t(n);
    }
    size_t size() const {
        return size_t(head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_acquire));
    }

    // ---- counters (read from any thread) ------------------------------------------------
    uint64_t pushed(EventType t) const { return pushed_[size_t(t)].load(std::memory_order_relaxed); }
    uint64_t dropped(EventType t) const { return dropped_[size_t(t)].load(std::memory_order_relaxed); }

   private:
    // Only the producer writes the counters, so a plain load+store (no locked instruction)
    // is enough; readers may see a slightly stale value.
    static void bump(std::atomic<uint64_t>& c) {
        c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }

    struct AlignedDelete {
        void operator()(Event* p) const { ::operator delete[](p, std::align_val_t(64)); }
    };
    std::unique_ptr<Event, AlignedDelete> buf_;
    size_t mask_ = 0;
    uint32_t thread_ = 0;
    // Producer-owned line: head and the producer's cached view of the tail.
    alignas(64) std::atomic<uint64_t> head_{0};
    uint64_t cached_tail_ = 0;
    std::atomic<uint64_t> pushed_[kNumEventTypes];
    std::atomic<uint64_t> dropped_[kNumEventTypes];
    // Consumer-owned line.
    alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace kv::trace
