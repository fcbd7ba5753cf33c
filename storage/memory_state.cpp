// Memory state and its encoding (see memory_state.h).
#include "storage/memory_state.h"

#include <cstring>

#include "storage/sqlite_util.h"

namespace kv::storage {

void memory_state_apply(MemoryState& s, int device, int category, int64_t t_ns, int64_t id, int64_t category_total,
                        int64_t device_total) {
    DeviceMemoryState& d = s[device];
    if (d.total.before(t_ns, id)) d.total = {t_ns, id, device_total, true};
    if (category >= 0 && size_t(category) < kNumMemCategories) {
        LatestValue& c = d.category[size_t(category)];
        if (c.before(t_ns, id)) c = {t_ns, id, category_total, true};
    }
}

// Layout: u32 entry count, then per entry: i32 device, i32 slot (-1 = device total, else the
// category), i64 t_ns, i64 id, i64 value.
namespace {
constexpr size_t kEntryBytes = 4 + 4 + 8 + 8 + 8;
template <class T>
void put(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
}
template <class T>
T get(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
}  // namespace

std::vector<uint8_t> encode_memory_state(const MemoryState& s) {
    std::vector<uint8_t> out;
    uint32_t n = 0;
    put(out, n);
    auto entry = [&](int device, int slot, const LatestValue& v) {
        if (!v.set) return;
        put(out, int32_t(device));
        put(out, int32_t(slot));
        put(out, v.t_ns);
        put(out, v.id);
        put(out, v.value);
        ++n;
    };
    for (const auto& [dev, d] : s) {
        entry(dev, -1, d.total);
        for (size_t c = 0; c < kNumMemCategories; ++c) entry(dev, int(c), d.category[c]);
    }
    std::memcpy(out.data(), &n, sizeof n);
    return out;
}

MemoryState decode_memory_state(const void* data, size_t bytes) {
    MemoryState s;
    if (bytes == 0) return s;
    const auto* p = static_cast<const uint8_t*>(data);
    if (bytes < 4) throw SessionError(SessionErrorKind::DAMAGED, "memory block state: shorter than its 4-byte header");
    const uint32_t n = get<uint32_t>(p);
    if (bytes != 4 + size_t(n) * kEntryBytes)
        throw SessionError(SessionErrorKind::DAMAGED, str("memory block state: ", bytes, " bytes, expected ",
                                                          4 + size_t(n) * kEntryBytes, " for ", n, " entries"));
    for (uint32_t i = 0; i < n; ++i) {
        const uint8_t* e = p + 4 + size_t(i) * kEntryBytes;
        const int device = get<int32_t>(e), slot = get<int32_t>(e + 4);
        const LatestValue v{get<int64_t>(e + 8), get<int64_t>(e + 16), get<int64_t>(e + 24), true};
        if (slot < -1 || slot >= int(kNumMemCategories))
            throw SessionError(SessionErrorKind::DAMAGED, str("memory block state: category ", slot, " out of range"));
        DeviceMemoryState& d = s[device];
        (slot < 0 ? d.total : d.category[size_t(slot)]) = v;
    }
    return s;
}

}  // namespace kv::storage
