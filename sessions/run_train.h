// The fine-tuning modes of a run (finetune_long_lora, finetune_long_full, finetune_offload_lora,
// finetune_offload_full): drives engine/train's Trainer with the run's hooks and turns each
// optimizer step and validation into metric rows (loss, lr, grad_norm, tokens_per_s, val_loss,
// val_accuracy), so the session file and the GUI show training curves as eval runs show theirs.
#pragma once

#include "engine/model/model_loader.h"
#include "run_execution.h"

namespace kv::sessions {

RunOutcome run_train_mode(const RunConfig& cfg, LoadedModel& lm, const RunHooks& hooks);

}  // namespace kv::sessions
