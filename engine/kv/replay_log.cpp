// Replay log size and position replay (see replay_log.h; the encoding is engine/telemetry/replay_plan.h).
#include "engine/kv/replay_log.h"

#include <algorithm>

namespace kv {

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
        for (int64_t r = 0; r < rows; ++r) apply_plan_to_row(p, r, pos.data() + r * L, L);
    }
    if (rows_out) *rows_out = rows;
    return pos;
}

}  // namespace kv
