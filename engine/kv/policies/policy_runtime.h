// Policies registered while the program runs (a Python class, kvlab.register_policy): a
// scorer outside the engine, behind a generic callback interface, on the score-based eviction
// machinery (policy_score_based.h). The engine knows nothing of Python: the binding
// (python/src/policies.cpp) implements ExternalScorer. Registered policies join the policy
// registry's lookups (policy_registry.cpp asks with_runtime_policies), so cache names, config
// validation, replay logs and every view treat them as any other policy.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv/policy_features.h"
#include "engine/kv/policies/policy_registry.h"

namespace kv {

// Row-major views into the engine's own arrays, valid for one call. rows = B * G; a feature
// the scorer did not declare is null.
struct ExternalFeatures {
    int64_t layer = 0;
    int64_t rows = 0, groups = 0;  // B * G, G
    int64_t n = 0;                 // new tokens (score_new) or the chunk's queries (update)
    int64_t input_pos = 0;         // score_new: tokens seen before the chunk; update: after it (the chunk included)
    int64_t slots = 0;             // L: the layer's cache length
    int64_t length = 0;            // T: slots filled (update)
    int64_t head_dim = 0, query_heads = 0;
    const float* key_norm = nullptr;    // (rows, n)
    const float* value_norm = nullptr;  // (rows, n)
    const float* keys = nullptr;        // (rows, n, head_dim)
    const float* values = nullptr;      // (rows, n, head_dim)
    const float* queries = nullptr;     // (B, query_heads, n, head_dim), rotated
    const int32_t* token_ids = nullptr; // (B, n) of the chunk, when the cache was given them
    const int32_t* positions = nullptr; // (rows, slots): token position per slot, -1 empty
    const float* weights = nullptr;     // update: (rows, length) attention-weight sums
    float* scores = nullptr;            // update: (rows, slots) the eviction scores, updated in place
};

// What a scorer needs (ScorePolicy computes only what someone reads).
struct ExternalNeeds {
    FeatureSet features;             // the InsertFeatures score_new() reads (ExternalFeatures' fields)
    bool token_ids = false;
    bool attention = false;          // update() gets the chunk's weight sums
    bool rescore = false;            // update() after every chunk even without attention (keydiff: scores of all held keys)
    int64_t attention_window = 0;    // only the chunk's last queries vote (0: all)
};

class ExternalScorer {
   public:
    virtual ~ExternalScorer() = default;
    // Scores of new tokens: out (rows, n) (lower = evicted first).
    virtual void score_new(const ExternalFeatures& f, float* out) = 0;
    // After a chunk attended (needs.attention: rewrite f.scores from f.weights; needs.rescore:
    // from the scorer's own state, f.weights null).
    virtual void update(const ExternalFeatures& f) = 0;
};

struct ExternalPolicySpec {
    std::string name;     // the {policy} part of cache names; not a built-in policy
    std::string summary;  // one line for help texts
    ExternalNeeds needs;
    // One scorer per layer cache (args.layer); may throw kv::Error.
    std::function<std::unique_ptr<ExternalScorer>(const PolicyArgs& args)> make;
};

// Registers (or replaces, by name) a policy. Throws kv::Error for a built-in name or a name
// that is not a word. Register before runs start: a run resolves its policy when it starts.
void register_external_policy(ExternalPolicySpec spec);
// Names of the registered external policies, in registration order.
std::vector<std::string> external_policy_names();

// The registry hooks: `builtin` plus the registered policies (builtin itself when none).
const std::vector<PolicyInfo>& with_runtime_policies(const std::vector<PolicyInfo>& builtin);
const std::vector<std::string>& with_runtime_policy_names(const std::vector<std::string>& builtin);

}  // namespace kv
