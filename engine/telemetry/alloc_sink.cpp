// RecorderAllocSink (see alloc_sink.h). Runs inside the allocator's call: one intern lookup and one
// queue push per event; it must never allocate through the tracker it listens to.
#include "alloc_sink.h"

#include "engine/telemetry/string_table.h"
#include "engine/telemetry/trace.h"

namespace kv::trace {

RecorderAllocSink::RecorderAllocSink(Recorder& recorder, MemoryTracker& tracker)
    : recorder_(recorder), tracker_(tracker) {
    tracker_.add_sink(this);
    const uint64_t t = now_ns();
    for (const DeviceMemoryStats& s : tracker_.all_stats()) {
        for (size_t c = 0; c < kNumMemCategories; ++c) {
            if (s.current[c] == 0) continue;
            Event ev;
            ev.alloc = AllocRecord{};
            ev.alloc.type = EventType::ALLOC;
            ev.alloc.category = MemCategory(c);
            ev.alloc.device = device_code(s.device);
            ev.alloc.flags = ALLOC_FLAGS_BASELINE;
            ev.alloc.label_id = intern("(allocated before recording)");
            ev.alloc.t_ns = t;
            ev.alloc.category_total = s.current[c];
            ev.alloc.device_total = s.current_total;
            ev.alloc.layer = ev.alloc.chunk = -1;
            recorder_.push(ev);
        }
    }
}

RecorderAllocSink::~RecorderAllocSink() { tracker_.remove_sink(this); }

void RecorderAllocSink::on_alloc_event(const AllocEvent& a) {
    Event ev;
    ev.alloc = AllocRecord{};
    ev.alloc.type = EventType::ALLOC;
    ev.alloc.category = a.category;
    ev.alloc.device = device_code(a.device);
    ev.alloc.flags = a.instrumentation ? ALLOC_FLAGS_INSTRUMENTATION : ALLOC_FLAGS_NONE;
    ev.alloc.label_id = a.label ? intern(*a.label) : 0;
    ev.alloc.t_ns = a.t_ns;
    ev.alloc.bytes = a.bytes;
    ev.alloc.address = a.address;
    ev.alloc.alloc_id = a.id;
    ev.alloc.category_total = a.category_total;
    ev.alloc.device_total = a.device_total;
    ev.alloc.layer = detail::t_context.layer;
    ev.alloc.chunk = detail::t_context.chunk;
    recorder_.push(ev);
}

}  // namespace kv::trace
