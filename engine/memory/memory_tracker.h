// The tracked allocator: every engine allocation goes through a MemoryTracker, which keeps
// current and peak bytes per (device, category), enforces a per-device budget before the OS
// or driver is asked, and reports each alloc/free to registered sinks (telemetry).
// It must not know about tensors, sessions or storage; sinks must not call back into it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "kernels/common/tensor_view.h"
#include "mem_category.h"

namespace kv {

struct AllocEvent {
    uint64_t id = 0;             // allocation id: the same for the alloc and its free
    int64_t bytes = 0;           // > 0 allocation, < 0 release
    MemCategory category = MemCategory::WORKSPACE;
    Device device{};
    uint64_t address = 0;
    uint64_t t_ns = 0;           // steady clock, see now_ns()
    int64_t category_total = 0;  // bytes of (device, category) after this event
    int64_t device_total = 0;    // bytes on the device after this event
    // Instrumentation (InstrumentationScope): memory that measures the run, not memory the run
    // needs -- fidelity's shadow cache (category kv_fidelity) and the dense reference and KL
    // passes' temporaries. Set on the allocation and on its release.
    bool instrumentation = false;
    int64_t instrumentation_total = 0;  // instrumentation bytes on the device after this event
    const std::string* label = nullptr;  // valid only during the callback
};

class AllocSink {
   public:
    virtual ~AllocSink() = default;
    // Called synchronously on the allocating thread; must be cheap and must not allocate
    // through the tracker that calls it.
    virtual void on_alloc_event(const AllocEvent& ev) = 0;
};

// Peak/current numbers for one device.
struct DeviceMemoryStats {
    Device device{};
    std::array<int64_t, kNumMemCategories> current{};
    std::array<int64_t, kNumMemCategories> peak{};
    int64_t current_total = 0;
    int64_t peak_total = 0;
    int64_t budget = -1;  // -1: none
    // The run's own memory apart from what measures it (see AllocEvent::instrumentation):
    // instrumentation bytes now and at their peak, and the peak of everything else.
    int64_t current_instrumentation = 0;
    int64_t peak_instrumentation = 0;
    int64_t peak_without_instrumentation = 0;
    // Per category: the instrumentation bytes in it now, and the peak of the rest (the run's
    // own bytes of that category; equal to `peak` in categories instrumentation never uses).
    std::array<int64_t, kNumMemCategories> current_instrumentation_by_category{};
    std::array<int64_t, kNumMemCategories> peak_without_instrumentation_by_category{};
};

class MemoryTracker {
   public:
    MemoryTracker() = default;
    MemoryTracker(const MemoryTracker&) = delete;
    MemoryTracker& operator=(const MemoryTracker&) = delete;

    // Allocate `bytes` on `device` (64-byte aligned on the CPU). Throws BudgetError when the
    // device budget would be exceeded, kv::Error when the device itself refuses.
    void* allocate(Device device, size_t bytes, MemCategory category, const std::string& label, uint64_t* id_out);
    // Release memory obtained from allocate() with the same device/bytes/category.
    void release(Device device, void* ptr, size_t bytes, MemCategory category, const std::string& label, uint64_t id);

    // Account for memory owned elsewhere (e.g. a memory-mapped weights file) without
    // allocating it; the matching unaccount() must use the same numbers.
    uint64_t account(Device device, size_t bytes, MemCategory category, const std::string& label, const void* address);
    void unaccount(Device device, size_t bytes, MemCategory category, const std::string& label, uint64_t id,
                   const void* address);

    int64_t current(Device device, MemCategory category) const;
    int64_t peak(Device device, MemCategory category) const;
    int64_t current_total(Device device) const;
    int64_t peak_total(Device device) const;
    DeviceMemoryStats stats(Device device) const;
    std::vector<DeviceMemoryStats> all_stats() const;
    // Peaks restart from the current values (e.g. at the start of a phase).
    void reset_peaks();

    // Per-device budget in bytes; a negative value removes it.
    void set_budget(Device device, int64_t bytes);
    int64_t budget(Device device) const;

    void add_sink(AllocSink* sink);
    void remove_sink(AllocSink* sink);

   private:
    struct DeviceSlot {
        Device device{};
        bool used = false;
        DeviceMemoryStats s{};
    };
    static constexpr int kMaxDevices = 17;  // cpu + 16 cuda devices
    DeviceSlot& slot(Device d);
    const DeviceSlot* find_slot(Device d) const;
    // total_reserved: the device total was already raised by the budget check.
    void record(Device device, int64_t delta, MemCategory category, const std::string& label, uint64_t id,
                const void* address, bool total_reserved);
    void check_budget_locked(DeviceSlot& s, Device device, size_t bytes, MemCategory category,
                             const std::string& label) const;

    mutable std::mutex mu_;
    std::array<DeviceSlot, kMaxDevices> slots_{};
    std::unordered_set<uint64_t> instrumentation_ids_;  // live instrumentation allocations outside kv_fidelity
    std::vector<AllocSink*> sinks_;
    std::atomic<uint64_t> next_id_{1};
};

// The process-wide tracker used when no scope is active.
MemoryTracker& default_memory_tracker();
// The tracker used by allocations on this thread (a run's worker thread sets its own).
MemoryTracker& current_memory_tracker();

// Routes this thread's allocations to `tracker` for the lifetime of the scope.
class MemoryTrackerScope {
   public:
    explicit MemoryTrackerScope(MemoryTracker& tracker);
    ~MemoryTrackerScope();
    MemoryTrackerScope(const MemoryTrackerScope&) = delete;
    MemoryTrackerScope& operator=(const MemoryTrackerScope&) = delete;

   private:
    MemoryTracker* prev_;
};

// Work that measures the run rather than being the run (fidelity's comparison with full
// attention, its dense reference pass and KL heads): for the lifetime of the scope this thread's
// allocations are instrumentation (category kv_fidelity is, always), and the scope's time is
// added to the thread's instrumentation seconds, so a run can report its own memory and speed
// apart from what measuring them cost. Nests (time counts once, in the outermost scope).
class InstrumentationScope {
   public:
    InstrumentationScope();
    ~InstrumentationScope();
    InstrumentationScope(const InstrumentationScope&) = delete;
    InstrumentationScope& operator=(const InstrumentationScope&) = delete;
    static bool active();
    // Seconds this thread has spent in outermost scopes so far (monotonic; take differences).
    static double thread_seconds();

   private:
    uint64_t t0_ns_ = 0;
};

// Default label for allocations made on this thread without an explicit label (e.g. the
// temporaries inside ops), so memory timelines can say "layer 3 mlp" instead of nothing.
class MemoryLabelScope {
   public:
    explicit MemoryLabelScope(std::string label);
    ~MemoryLabelScope();
    MemoryLabelScope(const MemoryLabelScope&) = delete;
    MemoryLabelScope& operator=(const MemoryLabelScope&) = delete;
    static const std::string& current();

   private:
    std::string prev_;
};

// Monotonic nanoseconds used for every engine timestamp.
uint64_t now_ns();

}  // namespace kv
