// Loading a GGUF file of an architecture gguf_config.h lists as a kvlab model: config, Hugging
// Face-named tensors in PyTorch layout ([out, in]; Q/K rows un-permuted for Llama and SmolLM3;
// gpt-oss's experts and DeepSeek-V2's split kv_b_proj rearranged into transformers' tensors;
// LFM2's convolution as [E, 1, L]) and the tokenizer data. The forward pass and the tokenizer are
// built elsewhere from what this returns.
#pragma once

#include <string>

#include "formats/gguf/gguf_tokenizer_data.h"
#include "engine/core/model_config.h"
#include "engine/core/weight_check.h"

namespace kv {

struct GgufLoadOptions {
    DType dtype = DType::F32;  // F32 or BF16: every tensor is delivered in this dtype
    bool zero_copy = true;     // F32 (or BF16 with dtype BF16) tensors needing no reordering view the mapping
    // Keep quantized matrices (q/k/v/o, gate/up/down, embedding, output) in their block format
    // (u8 [rows, blocks, block bytes], engine/model/packed_weight.h) instead of dequantizing;
    // a stacked group (q/k/v, gate/up) whose members differ in type is dequantized, and so are
    // latent attention's and the short convolution's matrices and the 3-D experts.
    bool packed = false;
};

struct GgufModel {
    ModelConfig config;          // tie_word_embeddings when the file has no output.weight
    // HF names; no lm_head.weight when tied. q/k/v (and their biases) and gate/up are views of
    // one stacked buffer per layer, in that order, so the Transformer adopts them without a copy.
    TensorMap tensors;
    GgufTokenizerData tokenizer;
    bool qk_unpermuted = false;  // true when Q/K rows were moved back to rotate-half order
    WeightCheckStats weight_check;  // the finiteness/magnitude check of every loaded weight
};

// Throws kv::Error naming the file for: malformed containers, unsupported architectures,
// tensors that are not part of the layout (or belong to a layer >= block_count), missing
// tensors, shapes that contradict the metadata, types kvlab cannot dequantize, tensors that do
// not tile the data section (gguf_parse), implausible config values, and non-finite or
// implausibly large weights (a NaN/Inf block scale shows in every value it scales).
GgufModel load_gguf_model(const std::string& path, const GgufLoadOptions& opt = {});

}  // namespace kv
