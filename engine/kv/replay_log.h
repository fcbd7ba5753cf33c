// The replay log: for every layer and chunk, the plan that placed the chunk's tokens (target
// slots and grace-ring moves). It rebuilds every cache state and every eviction, drives the
// gradient pipeline's replay caches, and is what the eviction views draw. Encoded compactly
// (a contiguous shared range as its start; explicit slots as uint32) by the one codec,
// engine/telemetry/replay_plan.h (encode_plan / decode_plan), which storage and views share.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/telemetry/replay_plan.h"
#include "engine/kv/kv_policy.h"

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

// Rebuild the (rows, L) token-position table after applying plans[0 .. upto) to an empty cache
// with L slots (-1 = empty). rows is the widest rows of the plans.
std::vector<int32_t> replay_positions(const std::vector<SlotPlan>& plans, size_t upto, int64_t L, int64_t* rows_out);

}  // namespace kv
