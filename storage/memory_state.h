// The memory state a block of memory events starts from: for every (device, category) and
// every device total, the value of the latest event so far by (t_ns, id), and its compact
// encoding in memory_blocks.state (storage/event_blocks.h).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/memory/mem_category.h"

namespace kv::storage {

// The latest event of one (device, category) or device total, by (t_ns, id).
struct LatestValue {
    int64_t t_ns = 0, id = 0, value = 0;
    bool set = false;
    bool before(int64_t t, int64_t i) const { return !set || t_ns < t || (t_ns == t && id < i); }
};
struct DeviceMemoryState {
    LatestValue total;
    std::array<LatestValue, kNumMemCategories> category{};
};
using MemoryState = std::map<int, DeviceMemoryState>;  // by device code

// Folds one memory event into `s` (keeps, per slot, the later by (t_ns, id)).
void memory_state_apply(MemoryState& s, int device, int category, int64_t t_ns, int64_t id, int64_t category_total,
                        int64_t device_total);
// Compact little-endian encoding (set slots only). decode throws SessionError(DAMAGED) on
// malformed bytes.
std::vector<uint8_t> encode_memory_state(const MemoryState& s);
MemoryState decode_memory_state(const void* data, size_t bytes);

}  // namespace kv::storage
