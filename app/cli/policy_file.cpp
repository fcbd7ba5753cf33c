// --kv_cache.policy_file (see policy_file.h) over the shared plugin loader
// (app/cli_python/policy_file_loader.h); kvlab itself never links the interpreter.
#include "policy_file.h"

#include <cstdio>

#include "app/cli_python/policy_file_loader.h"
#include "commands.h"
#include "engine/core/error.h"

namespace kv::cli {

std::string load_policy_file(const std::string& path) {
    static bool loaded = false;
    if (loaded) throw UsageError("--kv_cache.policy_file: given twice; expected one policy file per command");
    loaded = true;
    std::string name;
    try {
        name = load_python_policy_file(path);
    } catch (const Error& e) {
        throw UsageError(str("--kv_cache.policy_file: ", e.what()));
    }
    std::fprintf(stderr, "kvlab: policy '%s' from %s\n", name.c_str(), path.c_str());
    return name;
}

}  // namespace kv::cli
