// Checkpoints of a training run. One folder per checkpoint (out_dir/step-000050, out_dir/final):
//   adapter_model.safetensors + adapter_config.json   LoRA modes: PEFT names and a minimal
//                                                     PEFT config (r, lora_alpha, target_modules)
//   model.safetensors + config.json                   full modes: Hugging Face names, so the
//                                                     folder loads as a model (kvlab eval_long DIR)
//   classifier.safetensors                            seq_classification head ("score.weight/bias")
//   merged/ (final LoRA checkpoint only)              base + adapters folded in, as a model
//                                                     folder (kvlab eval_long DIR/merged)
//   training_state.json + optimizer.safetensors       what --resume needs: step, schedule, data
//                                                     split and iterator position, optimizer state
//                                                     (kept in the newest train.training_state_num
//                                                     checkpoints only, as the reference)
// Writes are atomic per file. Must not decide when to save or what is trained (trainer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/grad/lora.h"
#include "engine/core/model_config.h"
#include "engine/model/transformer.h"
#include "lr_schedule.h"

namespace kv {

// Everything of a run's progress that is not a tensor (saved as training_state.json).
struct TrainingState {
    int64_t step = 0;           // optimizer steps taken
    int64_t total_steps = 0;    // of the whole run
    int64_t micro_batches = 0;  // micro-batches consumed (seeds randomized chunk plans)
    LrSchedule schedule;
    std::string mode;           // finetune_long_lora, ...
    std::string optimizer;      // optim name ("adamw", ...)
    int64_t optimizer_steps = 0;
    nlohmann::json split;           // split_to_json
    nlohmann::json batch_iterator;  // BatchIterator::state
    nlohmann::json run_config;      // the run's options (for the compatibility check)
    std::vector<double> losses;     // training loss of every step so far
};

std::string checkpoint_dir_name(const std::string& out_dir, int64_t step);  // out_dir/step-000050

// PEFT's target_modules for kvlab's LoRA targets (q -> q_proj, mlp -> gate/up/down_proj, ...).
std::vector<std::string> peft_target_modules(const std::vector<std::string>& targets);

void save_lora_adapter(const std::string& dir, const Lora& lora, const std::string& base_model);
void save_full_weights(const std::string& dir, const Transformer& model);
// A Hugging Face model folder of the base with the adapters merged in (W + (alpha / r) B A).
void save_merged_model(const std::string& dir, const Transformer& model, const Lora& lora);
void save_tensors(const std::string& path, const TensorMap& tensors);
void save_training_state(const std::string& dir, const TrainingState& st, const TensorMap& optimizer_state);
// Deletes the resumable state of a checkpoint folder (training_state.json first, so the folder
// never looks complete without its optimizer state), keeping its adapters or weights.
void remove_training_state(const std::string& dir);

// `path` is a checkpoint folder or its training_state.json. Reads the state and fills
// *optimizer_state from optimizer.safetensors; *dir receives the folder. Throws kv::Error naming
// the file for anything missing or malformed.
TrainingState load_training_state(const std::string& path, TensorMap* optimizer_state, std::string* dir);

// Tensors of a safetensors file (memory-mapped; copy them before the file changes).
TensorMap load_tensors(const std::string& path);

}  // namespace kv
