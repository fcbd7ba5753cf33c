// The fine-tuning modes of a run (finetune_long_lora, finetune_long_full, finetune_offload_lora,
// finetune_offload_full): drives engine/train's Trainer with the run's hooks and turns each
// optimizer step and validation into metric rows (loss, lr, grad_norm, tokens_per_s, val_loss,
// val_accuracy), so the session file and the GUI show training curves as eval runs show theirs.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/memory/memory_tracker.h"
#include "engine/model/model_loader.h"
#include "run_execution.h"

namespace kv::sessions {

RunOutcome run_train_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks);

// Peak memory per device and category as the run summaries store it (run_execution.cpp).
nlohmann::json memory_json(const std::vector<DeviceMemoryStats>& stats);

}  // namespace kv::sessions
