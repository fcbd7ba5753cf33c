// Head models (reference §8): what turns the last layer's outputs into a loss per row.
//   next_token_prediction         cross-entropy of every targeted position (ignore -100),
//                                 summed per row; normaliser = targeted positions
//   seq_classification_on_logits  cross-entropy over the logits of C class tokens at the
//                                 last position (e.g. tokens "A".."D")
//   seq_classification            a Linear(E, C) head on the final-norm output, pooled at the
//                                 last position (or the mean); one cross-entropy per row
//                                 (keys_values' (B, C) reshape bug is not reproduced)
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace kv {

enum class HeadKind : uint8_t { NEXT_TOKEN, CLASS_ON_LOGITS, SEQ_CLASS };

HeadKind head_kind_from_name(const std::string& name);  // throws kv::Error listing names
const char* head_kind_name(HeadKind k);

struct HeadSpec {
    HeadKind kind = HeadKind::NEXT_TOKEN;
    int64_t B = 1, T = 0;
    std::vector<int32_t> token_targets;  // NEXT_TOKEN: (B, T), target of input position t, -100 = none
    std::vector<int32_t> labels;         // classification: (B) class index
    std::vector<int32_t> class_tokens;   // CLASS_ON_LOGITS: (C) token ids
    Tensor class_weight;                 // SEQ_CLASS: (C, E)
    Tensor class_bias;                   // SEQ_CLASS: (C) or undefined
    bool mean_pool = false;              // SEQ_CLASS: mean over positions instead of the last
    // NEXT_TOKEN in training (keys_values' average_loss_per_batch): row b's summed loss s_b is
    // divided by the batch's mean target count, l_b = s_b B / sum_b nz_b, so the batch loss is
    // the mean over all its target tokens. false: by the row's own count, l_b = s_b / nz_b.
    bool average_loss_per_batch = false;
    // NEXT_TOKEN: also keep the argmax token at every targeted position (copy tasks score it).
    bool record_argmax = false;
    // Also keep the loss of every scored position in HeadResult::token_loss (evaluation's
    // per-token record): the (B, n) row losses the head computes anyway, no extra logits.
    bool record_token_loss = false;
};

// Running sums a head accumulates over the chunks of a sequence.
struct HeadResult {
    std::vector<double> loss_sum;     // (B) summed cross-entropy
    std::vector<double> count;        // (B) normaliser (targeted positions, or 1)
    std::vector<int32_t> prediction;  // (B) argmax class / last predicted token
    std::vector<int32_t> target_argmax;  // record_argmax: argmax per targeted position, by chunk, row, position (B = 1: positions)
    // record_token_loss: (B, T) cross-entropy of the prediction at input position t (of
    // token_targets[t], or of the label at the last position for classification); NaN where
    // nothing was scored. Row b's finite entries sum to loss_sum[b].
    std::vector<float> token_loss;
    std::vector<double> class_logprob;  // (B, C) log-probabilities of the classes (classification)
    // seq_classification mean pooling: running sum of final-norm states (B, E)
    std::vector<double> pool_sum;
    int64_t pooled = 0;
    void init(int64_t B);
    double mean_loss() const;  // mean over rows of loss_sum / count
    double token_mean_loss() const;  // sum of loss_sum / sum of count (average_loss_per_batch)
};

}  // namespace kv
