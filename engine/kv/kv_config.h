// Every option of a KV cache, with keys_values' names and defaults (reference §4, §11). The
// cache name is "{policy}-{buffer}" (e.g. h2o-q8, lastrec-default), parsed by the one parser of
// engine/core/cache_name.h; validate() turns impossible settings into one message naming the option.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/core/cache_name.h"  // CacheName, the one parser
#include "engine/core/kv_names.h"    // kv_buffer_names(), find_buffer()
#include "kernels/common/dtype.h"
#include "kernels/common/quant_formats.h"
#include "engine/kv/policies/policy_registry.h"       // kv_policy_names(), find_policy()

namespace kv {

struct KVCacheConfig {
    std::string name = "dense-default";  // {policy}-{buffer}, canonical once set as a run option
    int64_t cache_length = 0;            // L (slots); 0 = the sequence length (dense only)
    std::vector<int64_t> layer_cache_lengths;  // optional per-layer L (overrides cache_length)
    // A rule for per-layer L instead of a list (resolved with the model's layer count):
    // "linear:FIRST:LAST" or "pyramid:BETA" (PyramidKV's schedule around cache_length, with
    // snapkv_window as the observation window).
    std::string layer_cache_rule;

    // score-based policies (h2o family, tova, snapkv, pyramidkv, knorm, random, rkv)
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
    std::string duo_gates;             // duo: gate file (or "pattern:BITS"), engine/kv/policies/duo_gates.h
    std::string qfilter;               // qfilter: filter file (or "axis:C"), engine/kv/policies/qfilter_filters.h
    std::string kvzap;                 // kvzap: surrogate file (or "seed:N"), engine/kv/policies/kvzap_weights.h
    // lukv-*: one ratio per (layer, KV head), stored as numbers ("1,0.5;0.25,1" or "pattern:R,...");
    // engine/kv/head_ratios.h
    std::string head_ratios;

    // buffers
    int64_t max_num_ranges = 4;        // quantized buffers: dirty ranges re-quantized per write-back
    // quantized buffers: rows of one head ("head": a scale per token and head) or of all heads of
    // a token ("token": one scale per token, vLLM's per-tensor scale taken per written token)
    std::string scale_granularity = "head";
    // fp8 buffers: a file of per-head scales from `kvlab calibrate kv-scales` (engine/kv/kv_scales.h),
    // one fixed scale per layer and KV head instead of a dynamic scale per row; empty: dynamic.
    std::string kv_scales;
    // An equal-byte budget instead of a length: all layers' stored K/V bytes per sequence
    // (codes and scales; not the shared dequantized working buffer), or a fraction of the
    // dense cache's bytes (seq_length tokens in the activation dtype). It sets cache_length.
    int64_t budget_bytes = 0;
    double budget_ratio = 0.0;
    // Quantized buffers: bits of the key and value codes (0: the buffer's own), each choosing the
    // format of its width in the buffer's family (q8/q4, q8_0/q4_0, fp8/fp4; kv_quant_formats).
    int64_t key_bits = 0, value_bits = 0;
    int64_t paged_block_size = 0;      // > 0: paged storage with blocks of this many slots
    bool compact = false;              // paged: after each chunk move kept slots so whole blocks are freed
    bool cpu_offload = false;          // park each layer's buffers in host memory between uses
    DType dtype = DType::F32;          // dtype of default buffers / the dequantized working buffer
    int64_t kivi_group_size = 32;      // kivi2/kivi4: slots per key group (= channels per value group, at most D)
    int64_t kivi_residual = 128;       // kivi2/kivi4: most recent tokens kept in full precision (KIVI's R)
    double key_channel_ratio = 0.5;    // think: fraction of each KV head's key channels pruned, in [0, 1)

    // Options of single policies, declared in the policy registry (PolicyInfo::options), by
    // name; an unset option has the registry's default.
    std::map<std::string, double> policy_options;
    double policy_option(const std::string& name) const;

    // derived from name by the one parser (read_cache_name: aliases read canonically)
    CacheName cache_name() const;  // {"h2o", "q8"}; {name, "default"} when name has no buffer
    std::string policy() const;    // "h2o"
    std::string buffer() const;    // "q8"
    // Slots of layer `layer` of `num_layers`: the list, else the rule (given, or the policy's
    // default rule), else cache_length; 0 = seq_length.
    int64_t length_for_layer(int64_t layer, int64_t seq_length, int64_t num_layers) const;
};

// The kv_cache.* options whose fields a policy names (snapkv's window, duo's gate file): their
// rows in the run option table (engine/run/run_config.cpp) come from here, so no code outside
// engine/kv names them. One of `integer` / `text` is set.
struct KVFieldOption {
    const char* name = "";  // without "kv_cache."
    const char* help = "";
    int64_t lo = 0, hi = 0;  // integers: the allowed range, inclusive
    int64_t KVCacheConfig::*integer = nullptr;
    std::string KVCacheConfig::*text = nullptr;
};
const std::vector<KVFieldOption>& kv_field_options();

// The names kvlab knows: kv_policy_names() (policy_registry.h) / kv_buffer_names() (kv_names.h).
bool policy_needs_attention_weights(const std::string& policy);

// --kv_cache.layer_cache_lengths: "64,48,32" (one per layer) or a rule ("linear:64:32",
// "pyramid:20", "ratios:1,0.5,0.25" or "ratios:FILE", a file's ratios stored as the list);
// throws kv::Error naming the option. The text form round-trips.
void set_layer_cache_lengths(KVCacheConfig& cfg, const std::string& text);
std::string layer_cache_lengths_text(const KVCacheConfig& cfg);
// Per-layer lengths of a rule for num_layers layers around the mean L; `window` (pyramid): the
// observation window every layer keeps on top of its budget. Throws on a bad rule.
// "ratios:R0,R1,..." or "ratios:FILE" (one ratio in (0, 1] per layer, '#' comments): the ratios,
// or a kv::Error naming the bad entry.
std::vector<double> parse_layer_ratios(const std::string& text);
std::vector<int64_t> layer_lengths_from_rule(const std::string& rule, int64_t L, int64_t num_layers, int64_t window);

// parse_cache_name against the policy registry: the boundary's parser (run options store its
// text()). Throws kv::Error when `name` is not "{policy}-{buffer}" with known parts.
CacheName parse_kv_cache_name(const std::string& name);
void check_kv_cache_name(const std::string& name);  // parse_kv_cache_name, result unused

// Quantized rows span all heads of a token (one row of G*D values) when asked for one scale per
// token, or when a head of D values is too small for either format (keys_values: D < 16).
bool quant_rows_over_heads(const KVCacheConfig& cfg, QuantFormat keys, QuantFormat values, int64_t D);
// The quant formats of keys and values of a quantized buffer: the buffer's own, or with
// key_bits / value_bits the format of that width in the family of the buffer's format (k8v4 is
// q8 keys, q4 values: "q8" with value_bits 4 is the same buffer). Throws kv::Error naming the
// option for a width the family lacks or a buffer without widths.
std::pair<QuantFormat, QuantFormat> kv_quant_formats(const KVCacheConfig& cfg);
// think: key channels kept per KV head of D, round((1 - ratio) D) and at least one.
int64_t think_kept_channels(int64_t D, double ratio);
// Exact bytes one slot of one layer stores for the keys and values of all G heads (scales and
// zero points included), for buffers that grow by whole slots (full precision, quantized rows);
// tensors = 1 where the values are the keys (ModelConfig::cache_tensors: a latent cache).
// Throws for KIVI, whose residual pool is fixed besides its codes.
int64_t kv_slot_bytes(const KVCacheConfig& cfg, int64_t G, int64_t D, DType act, int64_t tensors = 2);
// How a model's layers take a byte budget: `policy_layers` hold the policy's length each
// (-1: all num_layers); `fixed_slots` are held whatever it is, summed over the other layers
// (windowed layers' rings; KV-shared and convolution layers hold none). window_layer.h's
// budget_layers() fills it from a model.
struct BudgetLayers {
    int64_t policy_layers = -1;
    int64_t fixed_slots = 0;
};
// cfg with cache_length set from budget_bytes / budget_ratio (unchanged without a budget):
// floor((budget - fixed_slots * kv_slot_bytes) / (policy_layers * kv_slot_bytes)), the budget
// fields cleared (consumed). Throws kv::Error naming the option when no slot fits (or the fixed
// slots alone exceed the budget), when a keep-everything policy's seq_length tokens do not fit,
// or with a length given too.
KVCacheConfig apply_kv_budget(const KVCacheConfig& cfg, int64_t num_layers, int64_t G, int64_t D, DType act, int64_t seq_length,
                              int64_t tensors = 2, BudgetLayers layers = {});

// Throws kv::Error naming the option and what was expected.
void validate_kv_config(const KVCacheConfig& cfg, int64_t num_layers, int64_t head_dim, int64_t num_kv_heads);

}  // namespace kv
