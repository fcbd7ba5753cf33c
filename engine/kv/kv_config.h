// Every option of a KV cache, with keys_values' names and defaults (reference §4, §11). The
// cache name is "{policy}-{buffer}" (e.g. h2o-q8, lastrec-default). parse() splits and checks
// it; validate() turns impossible settings into one message naming the option.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/kv_names.h"  // kv_policy_names(), kv_buffer_names()
#include "kernels/common/dtype.h"

namespace kv {

struct KVCacheConfig {
    std::string name = "dense-default";  // {policy}-{buffer}
    int64_t cache_length = 0;            // L (slots); 0 = the sequence length (dense only)
    std::vector<int64_t> layer_cache_lengths;  // optional per-layer L (overrides cache_length)

    // score-based policies (h2o family, tova, snapkv, knorm)
    int64_t grace_period = 0;          // most recent tokens kept in a ring, never evicted (< L)
    double keep_initial_fraction = 0.05;  // first chunk after a full prefill keeps this fraction
    int64_t max_chunk_size = 0;        // 0: full argsort; else top-k of this size (off if > L/2)
    bool normalize_scores = false;     // divide accumulated scores by the age of each token
    double combination_constant = 0.5; // qh2o: c in c*mm(h2o) + (c-1)/2*mm(qerr) + (1-c)
    int64_t snapkv_window = 32;        // snapkv: last queries of a chunk that vote
    int64_t snapkv_kernel = 5;         // snapkv: average-pooling width over positions

    // position-based policies
    int64_t init_grace_tokens = -1;    // lastrec sinks; -1 = min(16, max(L/8, 1))
    int64_t sinks = 4;                 // streaming: attention sinks
    std::string end_initial_regex;     // smart-lastrec: end of the protected prompt prefix
    double max_initial_fraction = 0.1; // smart-lastrec: cap of the protected range (fraction of L)
    bool include_end_string = true;    // smart-lastrec
    int32_t pad_id = 0;                // smart-lastrec
    bool range_is_prefix = true;       // smart-lastrec

    // buffers
    int64_t max_num_ranges = 4;        // quantized buffers: dirty ranges re-quantized per write-back
    int64_t paged_block_size = 0;      // > 0: paged storage with blocks of this many slots
    bool cpu_offload = false;          // park each layer's buffers in host memory between uses
    DType dtype = DType::F32;          // dtype of default buffers / the dequantized working buffer

    // derived by parse()
    std::string policy() const;   // "h2o"
    std::string buffer() const;   // "q8"
    int64_t length_for_layer(int64_t layer, int64_t seq_length) const;
};

// The names kvlab knows: kv_policy_names() / kv_buffer_names() (engine/core/kv_names.h).
bool policy_needs_attention_weights(const std::string& policy);

// Throws kv::Error when `name` is not "{policy}-{buffer}" with known parts.
void check_kv_cache_name(const std::string& name);

// Throws kv::Error naming the option and what was expected.
void validate_kv_config(const KVCacheConfig& cfg, int64_t num_layers, int64_t head_dim, int64_t num_kv_heads);

}  // namespace kv
