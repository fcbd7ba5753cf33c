// The model's weights under their Hugging Face names, for saving fine-tuned weights and loading
// them back: q/k/v and gate/up are cut out of the stacked tensors the forward pass uses
// (transformer.h) as row views, so nothing is copied until the tensors are written. The merged
// LoRA export adds (alpha / r) B A to copies of the adapted weights.
#pragma once

#include "engine/grad/lora.h"
#include "engine/core/model_config.h"
#include "engine/model/transformer.h"

namespace kv {

// Every weight with its HF name ("model.layers.0.self_attn.q_proj.weight", ...); views of the
// live tensors. lm_head.weight is left out when the embeddings are tied.
TensorMap model_state_dict(const Transformer& model);

// Copies HF-named tensors into the model (any float dtype; converted). Every weight of
// model_state_dict must be present with its shape; throws kv::Error naming the first that is not.
void load_model_state_dict(Transformer& model, const TensorMap& weights);

// HF-named weights with the adapters folded in (W + (alpha / r) B A on each adapted slice),
// as new tensors; what PEFT's merge_and_unload saves.
TensorMap merged_lora_state_dict(const Transformer& model, const Lora& lora);

}  // namespace kv
