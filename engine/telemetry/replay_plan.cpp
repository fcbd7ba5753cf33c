// Replay-log plan encoding (see replay_plan.h).
#include "engine/telemetry/replay_plan.h"

#include <cstring>

#include "engine/core/error.h"

namespace kv {

bool SlotPlan::contiguous_range(int64_t* start) const {
    if (rows != 1 || n == 0 || moves != 0) return false;
    for (int64_t t = 1; t < n; ++t)
        if (targets[size_t(t)] != targets[0] + t) return false;
    if (start) *start = targets[0];
    return true;
}

namespace {
constexpr uint32_t kMagic = 0x5052564bu;  // "KVRP"
template <class T>
void put(std::vector<uint8_t>& b, T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
}
template <class T>
T take(const uint8_t*& p, const uint8_t* end) {
    if (size_t(end - p) < sizeof(T)) throw Error("replay log: blob is truncated");
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
}
}  // namespace

std::vector<uint8_t> encode_plan(const SlotPlan& p) {
    std::vector<uint8_t> b;
    int64_t start = 0;
    const bool range = p.contiguous_range(&start);
    put<uint32_t>(b, kMagic);
    put<uint16_t>(b, 1);
    put<uint16_t>(b, uint16_t((range ? 1 : 0) | (p.rerotate ? 2 : 0)));
    for (int64_t v : {p.input_pos, p.n, p.rows, p.moves, p.length_after}) put<int64_t>(b, v);
    if (range) {
        put<int64_t>(b, start);
    } else {
        for (int32_t t : p.targets) put<uint32_t>(b, uint32_t(t));
        for (int32_t t : p.move_from) put<uint32_t>(b, uint32_t(t));
        for (int32_t t : p.move_to) put<uint32_t>(b, uint32_t(t));
    }
    return b;
}

SlotPlan decode_plan(const uint8_t* data, size_t size) {
    const uint8_t *p = data, *end = data + size;
    if (take<uint32_t>(p, end) != kMagic) throw Error("replay log: bad magic (not a kvlab cache step)");
    const uint16_t version = take<uint16_t>(p, end);
    if (version != 1) throw Error(str("replay log: version ", version, " is newer than this kvlab (1)"));
    const uint16_t flags = take<uint16_t>(p, end);
    SlotPlan s;
    s.rerotate = (flags & 2) != 0;
    s.input_pos = take<int64_t>(p, end);
    s.n = take<int64_t>(p, end);
    s.rows = take<int64_t>(p, end);
    s.moves = take<int64_t>(p, end);
    s.length_after = take<int64_t>(p, end);
    if (s.n < 0 || s.rows < 1 || s.moves < 0 || s.n > (int64_t(1) << 31) || s.rows > (int64_t(1) << 20) || s.moves > s.n)
        throw Error("replay log: inconsistent sizes in blob");
    if (flags & 1) {  // one contiguous range shared by every row: its size does not depend on n
        if (s.rows != 1 || s.moves != 0) throw Error("replay log: inconsistent range plan in blob");
        const int64_t start = take<int64_t>(p, end);
        s.targets.resize(size_t(s.n));
        for (int64_t t = 0; t < s.n; ++t) s.targets[size_t(t)] = int32_t(start + t);
    } else {
        // Checked before allocating, so a damaged header cannot ask for gigabytes.
        if (int64_t(end - p) / 4 < s.rows * (s.n + 2 * s.moves)) throw Error("replay log: blob is truncated");
        auto read = [&](std::vector<int32_t>& v, int64_t count) {
            v.resize(size_t(count));
            for (int64_t i = 0; i < count; ++i) v[size_t(i)] = int32_t(take<uint32_t>(p, end));
        };
        read(s.targets, s.rows * s.n);
        read(s.move_from, s.rows * s.moves);
        read(s.move_to, s.rows * s.moves);
    }
    return s;
}

}  // namespace kv
