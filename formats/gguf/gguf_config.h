// GGUF hyper-parameters (general.architecture, {arch}.* keys, tokenizer ids) -> kv::ModelConfig
// for the architectures kvlab runs from GGUF: llama (also Mistral/SmolLM2, which llama.cpp
// converts as llama), qwen2, gemma2, gemma3, phi3, olmo2, smollm3 and gpt-oss. Pure metadata
// mapping: no tensors are read here.
#pragma once

#include "formats/gguf/gguf_parse.h"
#include "formats/gguf/gguf_tokenizer_data.h"
#include "engine/core/model_config.h"

namespace kv {

// Keys read ({a} = general.architecture):
//   {a}.block_count -> num_layers            {a}.embedding_length -> hidden_size
//   {a}.feed_forward_length -> intermediate  {a}.attention.head_count -> num_heads
//   {a}.attention.head_count_kv -> num_kv_heads (default: head_count)
//   {a}.attention.key_length -> head_dim (default: embedding_length / head_count)
//   {a}.attention.layer_norm_rms_epsilon -> rms_norm_eps
//   {a}.rope.freq_base -> rope_theta (default 10000)
//   {a}.rope.dimension_count -> partial_rotary_factor = dims / head_dim (default: all)
//   {a}.context_length -> max_position_embeddings
//   {a}.rope.scaling.{type,factor,original_context_length} or {a}.rope.scale_linear -> rope_scaling
//   vocab_size = number of tokenizer.ggml.tokens (else {a}.vocab_size); bos/eos/pad ids.
//   gpt-oss: {a}.expert_count, {a}.expert_used_count, {a}.expert_feed_forward_length (its
//   intermediate_size; feed_forward_length without experts), {a}.attention.sliding_window.
// Throws kv::Error naming the file and key for a missing key, a wrong type or an impossible
// value, and for architectures not listed above. tie_word_embeddings and qkv_bias
// depend on which tensors exist; gguf_model.cpp sets them.
ModelConfig gguf_model_config(const GgufFile& f, const GgufTokenizerData& tok);
ModelConfig gguf_model_config(const GgufFile& f);

}  // namespace kv
