// global-kvzip: what its tests read besides the KVPolicy interface. The policy itself is
// engine/kv/policies/policy_global_kvzip.cpp; docs/POLICIES.md#kvzip.
#pragma once

#include <cstdint>
#include <vector>

namespace kv {

class KVPolicy;

// The length a layer was given for the rest of the sequence once every layer's prefill was
// ranked; 0 before. Throws kv::Error when `p` is not a global-kvzip policy.
int64_t global_kvzip_budget(const KVPolicy& p);

// The global ranking: of all scores over all layers (scores[l]: layer l's, any order), the
// ceil(keep * M) highest (M = all of them; ties at the threshold go to the lower layer) are
// kept; returns how many of them each layer holds.
std::vector<int64_t> kvzip_global_counts(const std::vector<std::vector<double>>& scores, double keep);

}  // namespace kv
