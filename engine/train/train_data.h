// Training data of a fine-tuning run: every source the run options name (the synthetic tasks,
// text windows, LongBench v2, HELMET) turned into examples for the chosen head model, the
// seeded train/val split (reference §12) and micro-batches as model inputs.
//   classification heads        the prompt; the label is the class index
//   next_token_prediction       SFT (reference §8): prompt + response + EOS with the prompt
//                               masked, input = sequence[:-1]; the response is the answer
//                               letter (synthetic, LongBench) or one target text (HELMET);
//                               text windows predict every next token
// Must not run the model or know about optimizers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/driver/head_model.h"
#include "engine/core/model_config.h"
#include "engine/run/run_config.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv {

struct TrainExample {
    std::vector<int32_t> ids;      // (T) input tokens
    std::vector<int32_t> targets;  // NEXT_TOKEN: (T) target of each input position, -100 = none
    int32_t label = -1;            // classification heads: class index in [0, C)
    std::string description;
};

struct TrainData {
    HeadKind head = HeadKind::NEXT_TOKEN;
    std::vector<int32_t> class_tokens;  // CLASS_ON_LOGITS: (C) token ids of the classes
    int64_t num_classes = 0;            // classification heads: C
    std::vector<TrainExample> examples;
    TrainValSplit split;                // indices into examples
    std::string source;                 // "passkey: 16 samples of 256 tokens" (for logs)
};

// Throws kv::Error for a data source or head the trainer cannot use, naming the option.
TrainData build_train_data(const RunConfig& cfg, const Tokenizer& tok, const ModelConfig& mc);

// Token lengths of the examples at `indices` (for similar-length batching).
std::vector<int64_t> example_lengths(const TrainData& d, const std::vector<int64_t>& indices);

struct MicroBatch {
    Tensor ids;      // (B, T) int32, rows left-padded to the longest
    HeadSpec head;   // kind, targets / labels, class tokens (SEQ_CLASS weights set by the caller)
    int64_t tokens = 0;  // real (unpadded) tokens
};

// Rows shorter than the longest are left-padded with `pad_id` (targets -100 there). The
// padding is attended to like any token (the driver has no attention mask), as in the
// reference's left-padded batches; equal-length batches (the synthetic tasks) have none.
MicroBatch make_micro_batch(const TrainData& d, const std::vector<int64_t>& examples, int32_t pad_id, Device device);

}  // namespace kv
