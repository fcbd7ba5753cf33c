// cake (CAKE, Qin et al., ICLR 2025): what its formula test reads besides the KVPolicy
// interface. The policy itself is engine/kv/policies/policy_cake.cpp; docs/POLICIES.md#cake.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv/kv_policy.h"

namespace kv {

// The layer preference P_l = H_l^(1/tau1) V_l^(1/tau2) measured at the layer's prefill of the
// current sequence (0 before it). Throws kv::Error when `p` is not a cake policy.
double cake_preference(const KVPolicy& p);
// The observation window the policy uses: min(snapkv_window, prefill length / 2), at least 1.
int64_t cake_window(const KVPolicy& p);

// The budget rule: slots per layer summing to `total`, B_l = max(floor_l, w + lambda P_l) with
// lambda solving the sum (the paper's B_l = w + P_l / sum P * (total - N w) when no floor
// binds), rounded down with the remainder to the largest fractions (ties: the lower layer).
// All P_l = 0 (or a non-finite sum) counts as equal preferences; floors summing to total or
// more are returned as they are.
std::vector<int64_t> cake_layer_budgets(const std::vector<double>& pref, const std::vector<int64_t>& floors, int64_t total,
                                        int64_t window);

}  // namespace kv
