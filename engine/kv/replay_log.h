// The replay log: for every layer and chunk, the plan that placed the chunk's tokens (target
// slots and grace-ring moves). It rebuilds every cache state and every eviction, drives the
// gradient pipeline's replay caches, and is what the eviction views draw. Encoded compactly:
// a contiguous shared range is stored as (start); explicit slots as uint32.
#pragma once

#include <cstdint>
#include <vector>

#include "kv_policy.h"

namespace kv {

class ReplayLog {
   public:
    void clear() { plans_.clear(); }
    void append(const SlotPlan& p) { plans_.push_back(p); }
    const std::vector<SlotPlan>& plans() const { return plans_; }
    size_t size() const { return plans_.size(); }
    // Bytes the encoded log takes (what a session file stores).
    size_t encoded_bytes() const;

   private:
    std::vector<SlotPlan> plans_;
};

// Serialise one plan (for telemetry cache steps) and back. Layout, little-endian:
//   u32 magic 'KVRP', u16 version 1, u16 flags (1 = contiguous shared range),
//   i64 input_pos, n, rows, moves, length_after,
//   range: i64 start | explicit: u32 targets[rows * n]; then u32 move_from, move_to[rows * moves]
std::vector<uint8_t> encode_plan(const SlotPlan& p);
// Throws kv::Error on a malformed blob.
SlotPlan decode_plan(const uint8_t* data, size_t size);

// Rebuild the (rows, L) token-position table after applying plans[0 .. upto) to an empty cache
// with L slots (-1 = empty). rows is the widest rows of the plans.
std::vector<int32_t> replay_positions(const std::vector<SlotPlan>& plans, size_t upto, int64_t L, int64_t* rows_out);

}  // namespace kv
