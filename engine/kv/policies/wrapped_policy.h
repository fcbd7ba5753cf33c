// The descriptor of the scorer a wrapper policy wraps (critical-*, merging-*, cam-*,
// key-rerotation-*): a wrapper takes its inner scorer's needs from the scorer's own entry, so
// the two can never disagree about what the scorer reads.
#pragma once

#include <vector>

#include "policy_registry.h"

namespace kv {

// The entry named `inner` among `file` (a policy file's entries); a wrapper naming a scorer that
// file does not describe is a registry bug, refused naming both.
const PolicyInfo& wrapped_policy(const std::vector<PolicyInfo>& file, const char* inner, const char* wrapper);

}  // namespace kv
