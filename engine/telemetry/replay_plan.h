// The replay log's record format: a SlotPlan (where one chunk's tokens went and which old
// tokens moved) and its one binary encoding, carried by trace::cache_step events and stored in
// a session's cache_steps rows. The one encoder and the one decoder: the engine writes and
// replays with them, storage and the views decode stored rows with them.
// Value types and std only (it is part of the record vocabulary storage and the views read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kv {

// Where one chunk of n new tokens (positions input_pos .. input_pos + n - 1) goes.
struct SlotPlan {
    int64_t input_pos = 0;  // P: tokens already seen
    int64_t n = 0;          // tokens in this chunk
    int64_t rows = 1;       // 1 when every (b, g) uses the same slots, else B * G
    // targets[r * n + t]: slot receiving new token t in row r
    std::vector<int32_t> targets;
    // Grace ring (score policies, full cache): before the new tokens are written, the old
    // content of slot move_from[r * m + i] moves to move_to[r * m + i] (m = moves per row).
    int64_t moves = 0;
    std::vector<int32_t> move_from, move_to;
    int64_t length_after = 0;  // T after the write
    // After the write the kept keys take contiguous RoPE positions in token order and the
    // chunk's queries continue after them (key re-rotation, engine/kv/key_rotation.h), so a
    // replay turns its keys as the cache did.
    bool rerotate = false;

    bool contiguous_range(int64_t* start) const;  // targets == [s, s+n) for every row
};

// Serialise one plan (for telemetry cache steps) and back. Layout, little-endian:
//   u32 magic 'KVRP', u16 version 1, u16 flags (1 = contiguous shared range, 2 = rerotate),
//   i64 input_pos, n, rows, moves, length_after,
//   range: i64 start | explicit: u32 targets[rows * n]; then u32 move_from, move_to[rows * moves]
// A range plan is always 56 bytes whatever n is; an explicit one 48 + 4 * rows * (n + 2 * moves).
std::vector<uint8_t> encode_plan(const SlotPlan& p);
// Throws kv::Error naming what is wrong with a malformed blob (truncated, bad magic, newer
// version, inconsistent sizes).
SlotPlan decode_plan(const uint8_t* data, size_t size);

// One slot written by a replay: the token position it held (`old_pos`, -1 = empty) is replaced
// by `new_pos`. `moved`: a grace-ring move (new_pos is the moved slot's old content, -1 when it
// was empty); else new_pos is one of the chunk's new tokens.
struct SlotWrite {
    int32_t slot = 0;
    int32_t old_pos = -1;
    int32_t new_pos = -1;
    bool moved = false;
};

// The one slot-plan replay: replays one plan onto one cache row's slot table
// slot_pos[0 .. slots) (token position per slot, -1 = empty); the moves read the old table
// first, then the new tokens are written. Slots outside the table are ignored (a damaged plan
// cannot write out of bounds). on_write(const SlotWrite&) sees every write in order (moves,
// then new tokens), after the slot took its new value: what a reader counts (the eviction
// map's copies and eviction steps) it counts there.
template <class OnWrite>
void replay_plan_row(const SlotPlan& p, int64_t row, int32_t* slot_pos, int64_t slots, OnWrite&& on_write) {
    const int64_t pr = p.rows == 1 ? 0 : row;
    auto inside = [&](int32_t slot) { return slot >= 0 && int64_t(slot) < slots; };
    auto write = [&](int32_t slot, int32_t pos, bool moved) {
        const int32_t old = slot_pos[slot];
        slot_pos[slot] = pos;
        on_write(SlotWrite{slot, old, pos, moved});
    };
    if (p.moves > 0) {
        std::vector<int32_t> moved(size_t(p.moves));
        for (int64_t m = 0; m < p.moves; ++m) {
            const int32_t from = p.move_from[size_t(pr * p.moves + m)];
            moved[size_t(m)] = inside(from) ? slot_pos[from] : -1;
        }
        for (int64_t m = 0; m < p.moves; ++m) {
            const int32_t to = p.move_to[size_t(pr * p.moves + m)];
            if (inside(to)) write(to, moved[size_t(m)], true);
        }
    }
    for (int64_t t = 0; t < p.n; ++t) {
        const int32_t slot = p.targets[size_t(pr * p.n + t)];
        if (inside(slot)) write(slot, int32_t(p.input_pos + t), false);
    }
}

// The replay with nothing counted: the engine's replay log, the gradient replay's positions,
// storage's kept overlap, the Python module's cache states.
inline void apply_plan_to_row(const SlotPlan& p, int64_t row, int32_t* slot_pos, int64_t slots) {
    replay_plan_row(p, row, slot_pos, slots, [](const SlotWrite&) {});
}

}  // namespace kv
