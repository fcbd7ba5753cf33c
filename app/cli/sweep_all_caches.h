// `kvlab sweep --kv_cache.name all`: every registered policy that can run the sweep's protocol
// and buffer, read from the policy registry's descriptors and checked before anything runs; the
// others are listed with the reason (the configuration's problem, or under compress-then-ask the
// refusal of a trial compression on the sweep's model).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/run/run_config.h"

namespace kv::cli {

struct AllCaches {
    std::vector<std::string> policies;                          // in registry order
    std::vector<std::pair<std::string, std::string>> skipped;  // policy, why
};

// `options` as the sweep reads them (name, value; comma lists are axes): each cache is tried
// with the first value of every axis. Policies take their required options (kv_cache.* given
// on the command line) from `options` like any other.
AllCaches all_caches(const RunConfig& base, const std::vector<std::pair<std::string, std::string>>& options);

// Replaces a `kv_cache.name all` of `options` by the comma list of all_caches' policies and
// prints what was skipped (to stderr); the options unchanged when no `all` is given. Throws
// kv::Error when no policy can run.
void expand_all_caches(const RunConfig& base, std::vector<std::pair<std::string, std::string>>& options);

}  // namespace kv::cli
