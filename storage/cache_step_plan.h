// A cache_steps row's replay log decoded into the plan the engine recorded, through the one
// codec (engine/telemetry/replay_plan.h), for readers that rebuild cache states (the eviction
// views, exports). SlotPlan is part of the record vocabulary storage hands to its readers.
#pragma once

#include <string>

#include "engine/telemetry/replay_plan.h"
#include "storage/rows.h"

namespace kv::storage {

using kv::SlotPlan;

// Decodes row.replay_log into `out`. On a damaged blob returns false and sets `why` to what is
// wrong (truncated, bad magic, newer version, inconsistent sizes); `out` is left unchanged.
bool decode_cache_step(const CacheStepRow& row, SlotPlan& out, std::string& why);

}  // namespace kv::storage
