// --kv_cache.policy_file FILE.py: a policy written in Python (docs/PYTHON.md) for CLI runs and
// sweeps. With the Python module built (KVLAB_PYTHON), the CLI embeds the interpreter and
// registers the file's class into its own engine's policy registry; without it, a clear error.
#pragma once

#include <string>

namespace kv::cli {

// Registers the policy FILE defines; returns its name (the {policy} part of cache names).
// Throws UsageError naming the file and what went wrong (with the Python traceback).
std::string load_policy_file(const std::string& path);

}  // namespace kv::cli
