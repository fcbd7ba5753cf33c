// Tracked allocator implementation: bookkeeping under one mutex, device memory from the
// backend registry, sinks called after the bookkeeping so they see consistent totals.
#include "memory_tracker.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"

namespace kv {

namespace {
const char* const kCategoryNames[] = {"weights",     "kv_cache",  "kv_checkpoint", "activation_checkpoint",
                                      "activations", "gradients", "optimizer",     "workspace",
                                      "kv_offload",  "kv_fidelity", "kv_quant_scales", "kv_residual"};
static_assert(sizeof(kCategoryNames) / sizeof(kCategoryNames[0]) == kNumMemCategories,
              "category name table out of date");

thread_local MemoryTracker* t_current = nullptr;
thread_local int t_instrumentation = 0;  // InstrumentationScope depth

}  // namespace

const char* mem_category_name(MemCategory c) {
    return size_t(c) < kNumMemCategories ? kCategoryNames[size_t(c)] : "unknown";
}

MemCategory mem_category_from_name(const std::string& name) {
    for (size_t i = 0; i < kNumMemCategories; ++i)
        if (name == kCategoryNames[i]) return MemCategory(i);
    std::string all;
    for (size_t i = 0; i < kNumMemCategories; ++i) all += (i ? ", " : "") + std::string(kCategoryNames[i]);
    throw Error(str("unknown memory category '", name, "'; expected one of: ", all));
}

uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
}

MemoryTracker::DeviceSlot& MemoryTracker::slot(Device d) {
    int i = d.is_cpu() ? 0 : 1 + d.index;
    if (i < 0 || i >= kMaxDevices) throw Error(str("device ", device_name(d), " is out of range (at most 16 CUDA devices)"));
    DeviceSlot& s = slots_[size_t(i)];
    if (!s.used) {
        s.used = true;
        s.device = d;
        s.s.device = d;
    }
    return s;
}

const MemoryTracker::DeviceSlot* MemoryTracker::find_slot(Device d) const {
    int i = d.is_cpu() ? 0 : 1 + d.index;
    if (i < 0 || i >= kMaxDevices || !slots_[size_t(i)].used) return nullptr;
    return &slots_[size_t(i)];
}

void MemoryTracker::check_budget_locked(DeviceSlot& s, Device device, size_t bytes, MemCategory category,
                                        const std::string& label) const {
    if (s.s.budget < 0 || s.s.current_total + int64_t(bytes) <= s.s.budget) return;
    std::ostringstream in_use;
    bool first = true;
    for (size_t c = 0; c < kNumMemCategories; ++c) {
        if (!s.s.current[c]) continue;
        in_use << (first ? "" : ", ") << kCategoryNames[c] << " " << format_bytes(s.s.current[c]);
        first = false;
    }
    throw BudgetError(
        str("memory budget exceeded on ", device_name(device), ": allocating ", format_bytes(int64_t(bytes)), " for ",
            mem_category_name(category), label.empty() ? "" : str(" ('", label, "')"), " would use ",
            format_bytes(s.s.current_total + int64_t(bytes)), " of the ", format_bytes(s.s.budget), " budget (in use: ",
            first ? std::string("nothing") : in_use.str(), ")"),
        "raise the budget (--memory.budget) or lower cache_length, chunk_size or batch size");
}

void* MemoryTracker::allocate(Device device, size_t bytes, MemCategory category, const std::string& label,
                              uint64_t* id_out) {
    // Reserve under the lock first so two threads cannot both pass the budget check.
    {
        std::lock_guard<std::mutex> lk(mu_);
        DeviceSlot& s = slot(device);
        check_budget_locked(s, device, bytes, category, label);
        s.s.current_total += int64_t(bytes);
    }
    void* p = nullptr;
    try {
        p = device_alloc(device, bytes);  // throws kv::Error naming the device on failure
    } catch (...) {
        std::lock_guard<std::mutex> lk(mu_);
        slot(device).s.current_total -= int64_t(bytes);
        throw;
    }
    uint64_t id = next_id_.fetch_add(1);
    if (id_out) *id_out = id;
    record(device, int64_t(bytes), category, label, id, p, /*total_reserved=*/true);
    return p;
}

void MemoryTracker::release(Device device, void* ptr, size_t bytes, MemCategory category, const std::string& label,
                            uint64_t id) {
    device_free(device, ptr);
    record(device, -int64_t(bytes), category, label, id, ptr, false);
}

uint64_t MemoryTracker::account(Device device, size_t bytes, MemCategory category, const std::string& label,
                                const void* address) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        DeviceSlot& s = slot(device);
        check_budget_locked(s, device, bytes, category, label);
        s.s.current_total += int64_t(bytes);
    }
    uint64_t id = next_id_.fetch_add(1);
    record(device, int64_t(bytes), category, label, id, address, /*total_reserved=*/true);
    return id;
}

void MemoryTracker::unaccount(Device device, size_t bytes, MemCategory category, const std::string& label,
                              uint64_t id, const void* address) {
    record(device, -int64_t(bytes), category, label, id, address, false);
}

void MemoryTracker::record(Device device, int64_t delta, MemCategory category, const std::string& label, uint64_t id,
                           const void* address, bool total_reserved) {
    AllocEvent ev;
    std::vector<AllocSink*> sinks;
    {
        std::lock_guard<std::mutex> lk(mu_);
        DeviceSlot& s = slot(device);
        size_t c = size_t(category);
        s.s.current[c] += delta;
        if (!total_reserved) s.s.current_total += delta;
        s.s.peak[c] = std::max(s.s.peak[c], s.s.current[c]);
        s.s.peak_total = std::max(s.s.peak_total, s.s.current_total);
        // Instrumentation: kv_fidelity always; other categories when allocated in a scope (the
        // release, maybe on another thread or after the scope, finds the id).
        bool instr = category == MemCategory::KV_FIDELITY;
        if (!instr && delta > 0 && t_instrumentation > 0) {
            instr = true;
            instrumentation_ids_.insert(id);
        } else if (!instr && delta < 0 && !instrumentation_ids_.empty()) {
            instr = instrumentation_ids_.erase(id) > 0;
        }
        if (instr) {
            s.s.current_instrumentation_by_category[c] += delta;
            s.s.current_instrumentation += delta;
            s.s.peak_instrumentation = std::max(s.s.peak_instrumentation, s.s.current_instrumentation);
        }
        s.s.peak_without_instrumentation = std::max(s.s.peak_without_instrumentation, s.s.current_total - s.s.current_instrumentation);
        s.s.peak_without_instrumentation_by_category[c] =
            std::max(s.s.peak_without_instrumentation_by_category[c], s.s.current[c] - s.s.current_instrumentation_by_category[c]);
        if (sinks_.empty()) return;
        ev.instrumentation = instr;
        ev.instrumentation_total = s.s.current_instrumentation;
        ev.id = id;
        ev.bytes = delta;
        ev.category = category;
        ev.device = device;
        ev.address = uint64_t(reinterpret_cast<uintptr_t>(address));
        ev.t_ns = now_ns();
        ev.category_total = s.s.current[c];
        ev.device_total = s.s.current_total;
        sinks = sinks_;
    }
    ev.label = &label;
    for (AllocSink* k : sinks) k->on_alloc_event(ev);
}

int64_t MemoryTracker::current(Device device, MemCategory category) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    return s ? s->s.current[size_t(category)] : 0;
}
int64_t MemoryTracker::peak(Device device, MemCategory category) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    return s ? s->s.peak[size_t(category)] : 0;
}
int64_t MemoryTracker::current_total(Device device) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    return s ? s->s.current_total : 0;
}
int64_t MemoryTracker::peak_total(Device device) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    return s ? s->s.peak_total : 0;
}
DeviceMemoryStats MemoryTracker::stats(Device device) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    if (s) return s->s;
    DeviceMemoryStats z;
    z.device = device;
    return z;
}
std::vector<DeviceMemoryStats> MemoryTracker::all_stats() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<DeviceMemoryStats> out;
    for (const auto& s : slots_)
        if (s.used) out.push_back(s.s);
    return out;
}
void MemoryTracker::reset_peaks() {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& s : slots_) {
        s.s.peak = s.s.current;
        s.s.peak_total = s.s.current_total;
        s.s.peak_instrumentation = s.s.current_instrumentation;
        s.s.peak_without_instrumentation = s.s.current_total - s.s.current_instrumentation;
        for (size_t c = 0; c < kNumMemCategories; ++c)
            s.s.peak_without_instrumentation_by_category[c] = s.s.current[c] - s.s.current_instrumentation_by_category[c];
    }
}
void MemoryTracker::set_budget(Device device, int64_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    slot(device).s.budget = bytes < 0 ? -1 : bytes;
}
int64_t MemoryTracker::budget(Device device) const {
    std::lock_guard<std::mutex> lk(mu_);
    const DeviceSlot* s = find_slot(device);
    return s ? s->s.budget : -1;
}
void MemoryTracker::add_sink(AllocSink* sink) {
    std::lock_guard<std::mutex> lk(mu_);
    if (std::find(sinks_.begin(), sinks_.end(), sink) == sinks_.end()) sinks_.push_back(sink);
}
void MemoryTracker::remove_sink(AllocSink* sink) {
    std::lock_guard<std::mutex> lk(mu_);
    sinks_.erase(std::remove(sinks_.begin(), sinks_.end(), sink), sinks_.end());
}

MemoryTracker& default_memory_tracker() {
    static MemoryTracker tracker;
    return tracker;
}
MemoryTracker& current_memory_tracker() { return t_current ? *t_current : default_memory_tracker(); }

namespace {
thread_local std::string t_label;
}
MemoryLabelScope::MemoryLabelScope(std::string label) : prev_(std::move(t_label)) { t_label = std::move(label); }
MemoryLabelScope::~MemoryLabelScope() { t_label = std::move(prev_); }
const std::string& MemoryLabelScope::current() { return t_label; }

namespace {
thread_local uint64_t t_instrumentation_ns = 0;
}
InstrumentationScope::InstrumentationScope() {
    if (t_instrumentation++ == 0) t0_ns_ = now_ns();
}
InstrumentationScope::~InstrumentationScope() {
    if (--t_instrumentation == 0) t_instrumentation_ns += now_ns() - t0_ns_;
}
bool InstrumentationScope::active() { return t_instrumentation > 0; }
double InstrumentationScope::thread_seconds() { return double(t_instrumentation_ns) * 1e-9; }

MemoryTrackerScope::MemoryTrackerScope(MemoryTracker& tracker) : prev_(t_current) { t_current = &tracker; }
MemoryTrackerScope::~MemoryTrackerScope() { t_current = prev_; }

}  // namespace kv
