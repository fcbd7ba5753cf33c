// Cache-step decoding for readers (see cache_step_plan.h).
#include "storage/cache_step_plan.h"

#include <exception>

namespace kv::storage {

bool decode_cache_step(const CacheStepRow& row, SlotPlan& out, std::string& why) {
    try {
        out = decode_plan(row.replay_log.data(), row.replay_log.size());
        return true;
    } catch (const std::exception& e) {
        why = e.what();
        return false;
    }
}

}  // namespace kv::storage
