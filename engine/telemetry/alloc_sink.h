// Bridges the tracked allocator to telemetry: every alloc/free of a MemoryTracker becomes an
// ALLOC record of one Recorder, stamped with the allocating thread's innermost span layer/chunk.
// Runs synchronously inside the allocator (under no tracker lock), so it must stay a copy and a
// queue push; it never allocates through the tracker it listens to.
#pragma once

#include "engine/memory/memory_tracker.h"
#include "engine/telemetry/recorder.h"

namespace kv::trace {

// Turns tracked-allocator events into ALLOC records of `recorder` (whatever thread allocates).
// On construction it attaches to `tracker` and records one baseline per (device, category)
// already in use, so category totals in exports add up from the first event; detaches on
// destruction.
class RecorderAllocSink : public AllocSink {
   public:
    RecorderAllocSink(Recorder& recorder, MemoryTracker& tracker);
    ~RecorderAllocSink() override;
    RecorderAllocSink(const RecorderAllocSink&) = delete;
    RecorderAllocSink& operator=(const RecorderAllocSink&) = delete;
    void on_alloc_event(const AllocEvent& ev) override;

   private:
    Recorder& recorder_;
    MemoryTracker& tracker_;
};

}  // namespace kv::trace
