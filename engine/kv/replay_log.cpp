// Replay log encoding and position replay (see replay_log.h).
#include "replay_log.h"

#include <algorithm>
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
    put<uint16_t>(b, range ? 1 : 0);
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
    s.input_pos = take<int64_t>(p, end);
    s.n = take<int64_t>(p, end);
    s.rows = take<int64_t>(p, end);
    s.moves = take<int64_t>(p, end);
    s.length_after = take<int64_t>(p, end);
    if (s.n < 0 || s.rows < 1 || s.moves < 0 || s.n > (int64_t(1) << 31) || s.rows > (int64_t(1) << 20) ||
        s.moves > s.n || s.rows * (s.n + 2 * s.moves) > int64_t(size))
        throw Error("replay log: inconsistent sizes in blob");
    if (flags & 1) {
        const int64_t start = take<int64_t>(p, end);
        for (int64_t t = 0; t < s.n; ++t) s.targets.push_back(int32_t(start + t));
    } else {
        for (int64_t i = 0; i < s.rows * s.n; ++i) s.targets.push_back(int32_t(take<uint32_t>(p, end)));
        for (int64_t i = 0; i < s.rows * s.moves; ++i) s.move_from.push_back(int32_t(take<uint32_t>(p, end)));
        for (int64_t i = 0; i < s.rows * s.moves; ++i) s.move_to.push_back(int32_t(take<uint32_t>(p, end)));
    }
    return s;
}

size_t ReplayLog::encoded_bytes() const {
    size_t n = 0;
    for (const auto& p : plans_) n += encode_plan(p).size();
    return n;
}

std::vector<int32_t> replay_positions(const std::vector<SlotPlan>& plans, size_t upto, int64_t L, int64_t* rows_out) {
    int64_t rows = 1;
    for (size_t i = 0; i < upto && i < plans.size(); ++i) rows = std::max(rows, plans[i].rows);
    std::vector<int32_t> pos((size_t)(rows * L), -1);
    for (size_t i = 0; i < upto && i < plans.size(); ++i) {
        const SlotPlan& p = plans[i];
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t pr = p.rows == 1 ? 0 : r;
            int32_t* row = pos.data() + r * L;
            // Moves first (they read the state before this chunk), through a copy.
            std::vector<int32_t> moved((size_t)p.moves);
            for (int64_t m = 0; m < p.moves; ++m) moved[size_t(m)] = row[p.move_from[size_t(pr * p.moves + m)]];
            for (int64_t m = 0; m < p.moves; ++m) row[p.move_to[size_t(pr * p.moves + m)]] = moved[size_t(m)];
            for (int64_t t = 0; t < p.n; ++t) row[p.targets[size_t(pr * p.n + t)]] = int32_t(p.input_pos + t);
        }
    }
    if (rows_out) *rows_out = rows;
    return pos;
}

}  // namespace kv
