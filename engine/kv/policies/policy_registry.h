// The one table of KV-cache policies. Every policy file describes its policies (name, factory,
// needs, allowed buffers, options, doc anchor) in a PolicyInfo; policy_registry.cpp lists the
// files once. Names, make_policy, validation, the CLI help, the GUI form's choices and the
// registry-loop tests all read this table — nothing else may keep a list of policy names.
// Adding a policy: docs/POLICIES.md "Adding a policy".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kv {

struct KVCacheConfig;
class KVPolicy;
class ReadSelection;
struct TextCodec;

// What a factory gets: the config, this layer's cache length L and KV heads G, the layer
// index (policies that differ per layer, e.g. random's stream), and the text codec.
struct PolicyArgs {
    const KVCacheConfig& cfg;
    int64_t L = 0;
    int64_t G = 0;
    int64_t layer = 0;
    const TextCodec* text = nullptr;
};
using PolicyFactory = std::unique_ptr<KVPolicy> (*)(const PolicyArgs& args);

// An option of one policy alone: it lives in KVCacheConfig::policy_options, and its row in
// the run option table (--kv_cache.<name>: CLI, JSON, GUI form) is generated from here.
struct PolicyOption {
    std::string name = {};  // without "kv_cache.", e.g. "random_seed"; unique over the registry
    std::string help = {};  // one line
    double def = 0;    // the paper's (or kvlab's) default
    double lo = 0, hi = 0;  // allowed range, inclusive
    bool integer = false;
};

struct PolicyInfo {
    // Every member has a default initializer, so a descriptor names only what it sets
    // (designated initializers; GCC warns about members without one).
    std::string name = {};     // the {policy} part of "{policy}-{buffer}"
    std::string summary = {};  // one line for help texts
    PolicyFactory make = nullptr;
    bool needs_attention_weights = false;  // update() needs the chunk's weight sums
    bool needs_quantized_buffer = false;   // scores read the quantization error
    bool needs_cache_length = true;        // false: cache_length 0 = the whole sequence (dense)
    bool evicts = true;                    // false: never drops a token, so a cache shorter than a sample cannot run (dense, quest)
    bool needs_text = false;               // reads the prompt through a TextCodec (tokenizer)
    // Folds evicted values into kept slots (merging-*, cam-*: SlotPlan's value merges), so a kept
    // slot's value is a blend of tokens while its key stays its own token's.
    bool merges_values = false;
    std::vector<std::string> buffers = {};   // allowed buffers; empty = every buffer
    std::vector<std::string> uses = {};      // shared kv_cache.* options it reads (KVCacheConfig fields)
    std::vector<PolicyOption> options = {};  // its own options
    // Options that must be set for a valid config (e.g. smart-lastrec's regex), as name=value
    // pairs of run options; the registry-loop tests use them.
    std::vector<std::pair<std::string, std::string>> required = {};
    // Per-layer budgets when --kv_cache.layer_cache_lengths is not given (PyramidKV), as that
    // option's rule text; empty = cache_length for every layer.
    std::string default_layer_rule = {};
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // Policies that decide each layer's length during the sequence (cake): every layer's length
    // until then (its prefill), from the config and the layer count; null = fixed lengths.
    int64_t (*initial_layer_length)(const KVCacheConfig& cfg, int64_t num_layers) = nullptr;
    // ---- end of capabilities ----
    std::string doc_anchor = {};  // section of docs/POLICIES.md, e.g. "docs/POLICIES.md#random"
    // Checks needing the model's shape (duo: its gate file); throws kv::Error naming the option.
    void (*validate)(const KVCacheConfig& cfg, int64_t num_layers, int64_t num_kv_heads) = nullptr;
    // ---- capabilities (engine/kv only; tools/layers/check_layers.py forbids them elsewhere) ----
    // The lengths the chunk planner must respect when the policy keeps fewer slots than the
    // layer's length (duo's streaming heads) or reads only its first chunk densely (quest's
    // quest_prefill): lengths[l] in, the planned length out. Callers use policy_plan_lengths().
    void (*plan_lengths)(const KVCacheConfig& cfg, int64_t num_kv_heads, std::vector<int64_t>& lengths) = nullptr;
    // Reading a selection of the cache (quest), for the gradient replay (read_selection.h);
    // null = every slot is read. Callers use make_read_selection().
    std::unique_ptr<ReadSelection> (*read_selection)(const KVCacheConfig& cfg) = nullptr;
    // ---- end of capabilities ----
};

// Builds a policy from its descriptor and attaches the capabilities its class implements
// (policy_capabilities.h). make_policy() and policies wrapping another (duo, ada-*) build
// through it, never through info.make directly.
std::unique_ptr<KVPolicy> build_policy(const PolicyInfo& info, const PolicyArgs& args);

// Every policy, in display order.
const std::vector<PolicyInfo>& policy_registry();
// nullptr when unknown.
const PolicyInfo* find_policy(const std::string& name);
// The names of policy_registry(), in order (the {policy} parts of cache names).
const std::vector<std::string>& kv_policy_names();
// The own option `name` of any policy (nullptr when none declares it), and its owner.
const PolicyOption* find_policy_option(const std::string& name, const PolicyInfo** owner = nullptr);

// The lengths the chunk planner must respect for cfg's policy (PolicyInfo::plan_lengths; the
// run planner calls it once, for every policy).
void policy_plan_lengths(const KVCacheConfig& cfg, int64_t num_kv_heads, std::vector<int64_t>& lengths);

// "The policies: dense (never evicts), ..." — one line per policy, for help texts.
std::string policy_help_text();

}  // namespace kv
