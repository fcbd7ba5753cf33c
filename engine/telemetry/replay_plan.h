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

    bool contiguous_range(int64_t* start) const;  // targets == [s, s+n) for every row
};

// Serialise one plan (for telemetry cache steps) and back. Layout, little-endian:
//   u32 magic 'KVRP', u16 version 1, u16 flags (1 = contiguous shared range),
//   i64 input_pos, n, rows, moves, length_after,
//   range: i64 start | explicit: u32 targets[rows * n]; then u32 move_from, move_to[rows * moves]
// A range plan is always 56 bytes whatever n is; an explicit one 48 + 4 * rows * (n + 2 * moves).
std::vector<uint8_t> encode_plan(const SlotPlan& p);
// Throws kv::Error naming what is wrong with a malformed blob (truncated, bad magic, newer
// version, inconsistent sizes).
SlotPlan decode_plan(const uint8_t* data, size_t size);

// Replays one plan onto one cache row's slot table slot_pos[0 .. slots) (token position per
// slot, -1 = empty): the moves read the old table first, then the new tokens are written.
// Slots outside the table are ignored (a damaged plan cannot write out of bounds).
void apply_plan_to_row(const SlotPlan& p, int64_t row, int32_t* slot_pos, int64_t slots);

}  // namespace kv
