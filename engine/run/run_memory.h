// The memory a run needs for everything that scales with a user number (cache length, sequence
// length, batch, chunk size, vocabulary), sized from the configuration before anything of it is
// allocated. Lower bounds: a run refused here could never have fit; one that passes is still
// held to the budget allocation by allocation (MemoryTracker).
#pragma once

#include <vector>

#include "engine/memory/size_budget.h"
#include "engine/core/model_config.h"
#include "engine/run/run_config.h"

namespace kv {

std::vector<SizedItem> run_memory_items(const RunConfig& cfg, const ModelConfig& model);
// Throws kv::Error naming the number and what it needs when the items exceed cfg.memory_budget
// (or physical memory when no budget is set).
void check_run_memory(const RunConfig& cfg, const ModelConfig& model);

}  // namespace kv
