// The head's part of the reverse pass (reference §9.3 step 1): from the final-layer states of
// a token range, the loss and its gradient w.r.t. those states, in token blocks small enough
// that the logits stay bounded (B x block x V). Covers all three head models.
#pragma once

#include <vector>

#include "engine/driver/head_model.h"
#include "engine/model/transformer.h"
#include "engine/model/model_grads.h"

namespace kv {

struct HeadGrads {
    ModelGrads* model = nullptr;     // final norm and lm_head (full fine-tuning), else null
    Tensor* class_weight = nullptr;  // seq_classification head (C, E), null = frozen
    Tensor* class_bias = nullptr;
    // LinearAdapters::backward of the lm_head site (LoRA on the head accumulates its gradients
    // there). false: the loss alone, without touching adapter gradients; dx then lacks the
    // adapters' share (replay_loss, which discards dx).
    bool adapters = true;
};

// Per-row loss weights: loss = sum_b weight[b] * (summed cross-entropy of row b). For
// keys_values' normalisation weight[b] = scale / (B * targeted tokens of row b), or with
// head.average_loss_per_batch scale / (targeted tokens of the batch).
std::vector<double> head_row_weights(const HeadSpec& head, double scale);

// x (B, n, E): final-layer outputs of tokens [start, start + n) (contiguous, device). Writes
// dx (B, n, E) (overwritten), accumulates parameter gradients, returns this range's share of
// the loss. `pooled` (B, E) is the mean of the final-norm states over the whole sequence for
// mean-pooled seq_classification (computed beforehand), else ignored.
double head_backward(const Transformer& model, const Tensor& x, int64_t start, const HeadSpec& head,
                     const std::vector<double>& row_weight, Tensor& dx, const HeadGrads& grads, int64_t max_logit_bytes,
                     const Tensor& pooled = {});

}  // namespace kv
