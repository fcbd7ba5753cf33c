// The scorer a wrapper wraps (see wrapped_policy.h).
#include "wrapped_policy.h"

#include "engine/core/error.h"

namespace kv {

const PolicyInfo& wrapped_policy(const std::vector<PolicyInfo>& file, const char* inner, const char* wrapper) {
    for (const PolicyInfo& p : file)
        if (p.name == inner) return p;
    throw Error(str("policy registry: ", wrapper, " wraps '", inner, "', which its file does not describe"));
}

}  // namespace kv
