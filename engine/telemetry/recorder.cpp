// Recorder implementation: per-thread queue lookup through a tiny thread-local cache (so a push
// is a compare, a 64-byte copy and a release store), registration under a lock that only the
// first push of a thread takes, and draining in place.
#include "recorder.h"

#include <algorithm>

namespace kv::trace {

namespace {
std::atomic<uint64_t> g_next_recorder_uid{1};
std::atomic<uint32_t> g_next_thread_index{1};

// Two entries: a thread usually pushes to one recorder, sometimes two (a run's recorder and
// the allocator sink of another run sharing a worker thread). Keyed by uid, never by address,
// so a recorder allocated where a destroyed one lived cannot hit a stale entry.
struct QueueCacheEntry {
    uint64_t uid = 0;
    EventQueue* queue = nullptr;
};
constinit thread_local QueueCacheEntry t_cache[2] = {};
constinit thread_local uint32_t t_thread_index = 0;
}  // namespace

uint32_t thread_index() {
    if (t_thread_index == 0) t_thread_index = g_next_thread_index.fetch_add(1, std::memory_order_relaxed);
    return t_thread_index;
}

uint64_t RecorderStats::total_pushed() const {
    uint64_t n = 0;
    for (auto v : pushed) n += v;
    return n;
}
uint64_t RecorderStats::total_dropped() const {
    uint64_t n = 0;
    for (auto v : dropped) n += v;
    return n;
}

Recorder::Recorder(const RecorderOptions& options)
    : options_(options), uid_(g_next_recorder_uid.fetch_add(1, std::memory_order_relaxed)) {
    if (options_.queue_capacity < 16) options_.queue_capacity = 16;
    if (options_.score_interval < 1) options_.score_interval = 1;
}

Recorder::~Recorder() { discard(); }

EventQueue* Recorder::register_thread() {
    const uint32_t me = thread_index();
    std::lock_guard<std::mutex> lk(register_mu_);
    for (auto& q : owned_)
        if (q->thread() == me) return q.get();
    size_t n = num_queues_.load(std::memory_order_relaxed);
    if (n >= kMaxQueues) return nullptr;
    owned_.push_back(std::make_unique<EventQueue>(options_.queue_capacity, me));
    EventQueue* q = owned_.back().get();
    queues_[n].store(q, std::memory_order_release);
    num_queues_.store(n + 1, std::memory_order_release);
    return q;
}

EventQueue* Recorder::queue_for_this_thread() {
    if (t_cache[0].uid == uid_) return t_cache[0].queue;
    if (t_cache[1].uid == uid_) {
        std::swap(t_cache[0], t_cache[1]);
        return t_cache[0].queue;
    }
    EventQueue* q = register_thread();
    if (!q) return nullptr;
    t_cache[1] = t_cache[0];
    t_cache[0] = {uid_, q};
    return q;
}

bool Recorder::push(Event& ev) {
    EventQueue* q = queue_for_this_thread();
    if (q && q->try_push(ev)) return true;
    if (!q) unqueued_dropped_[size_t(ev.type())].fetch_add(1, std::memory_order_relaxed);
    event_free_payload(ev);
    return false;
}

size_t Recorder::drain(EventSink& sink, size_t max_events) {
    std::lock_guard<std::mutex> lk(drain_mu_);
    size_t total = 0;
    const size_t n = num_queues_.load(std::memory_order_acquire);
    if (n == 0) return 0;
    auto take = [&](size_t i, size_t budget) {
        EventQueue* q = queues_[i].load(std::memory_order_acquire);
        return q->consume(
            [&](Event& ev) {
                sink.on_event(ev);
                event_free_payload(ev);
            },
            budget);
    };
    // Fair share first, so one busy thread cannot starve the others into dropping; then
    // whatever budget is left, starting from a rotating queue.
    const size_t share = std::max<size_t>(1, max_events / n);
    for (size_t k = 0; k < n && total < max_events; ++k)
        total += take((drain_start_ + k) % n, std::min(share, max_events - total));
    for (size_t k = 0; k < n && total < max_events; ++k) total += take((drain_start_ + k) % n, max_events - total);
    drain_start_ = (drain_start_ + 1) % n;
    return total;
}

size_t Recorder::discard() {
    std::lock_guard<std::mutex> lk(drain_mu_);
    size_t total = 0;
    const size_t n = num_queues_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
        total +=
            queues_[i].load(std::memory_order_acquire)->consume([](Event& ev) { event_free_payload(ev); }, SIZE_MAX);
    return total;
}

RecorderStats Recorder::stats() const {
    RecorderStats s;
    const size_t n = num_queues_.load(std::memory_order_acquire);
    s.queues = n;
    for (size_t i = 0; i < n; ++i) {
        const EventQueue* q = queues_[i].load(std::memory_order_acquire);
        for (size_t t = 0; t < kNumEventTypes; ++t) {
            s.pushed[t] += q->pushed(EventType(t));
            s.dropped[t] += q->dropped(EventType(t));
        }
        s.pending += q->size();
    }
    // Threads beyond kMaxQueues have no queue: everything they push is dropped.
    for (size_t t = 0; t < kNumEventTypes; ++t) s.dropped[t] += unqueued_dropped_[t].load(std::memory_order_relaxed);
    s.gpu_dropped = gpu_dropped_.load(std::memory_order_relaxed);
    return s;
}

}  // namespace kv::trace
