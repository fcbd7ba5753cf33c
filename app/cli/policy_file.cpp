// --kv_cache.policy_file (see policy_file.h): opens the Python plugin (python_plugin_api.h) and
// hands it the file; kvlab itself never links the interpreter.
#include "policy_file.h"

#include <dlfcn.h>

#include <cstdio>
#include <vector>

#include "app/cli/python_plugin_api.h"
#include "commands.h"
#include "engine/core/error.h"
#include "engine/kv/policy_registry.h"
#include "kernels/cpu/cpu_variants.h"

namespace kv::cli {

std::string load_policy_file(const std::string& path) {
    static bool loaded = false;
    if (loaded) throw UsageError("--kv_cache.policy_file: given twice; expected one policy file per command");
    loaded = true;
    const std::string dir = cpu::executable_dir();
    // Beside the executable in a build tree, in lib/kvlab when installed (as the kernel plugins).
    const std::vector<std::string> candidates = {dir + "/" + kPythonPluginFile, dir + "/../lib/kvlab/" + kPythonPluginFile};
    void* lib = nullptr;
    std::string why;
    for (const std::string& p : candidates) {
        if (lib) break;
        lib = dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL);  // global: numpy's extensions resolve libpython through it
        if (!lib) why += str("\n  ", p, ": ", dlerror());
    }
    if (!lib)
        throw UsageError(str("--kv_cache.policy_file '", path, "': the Python plugin ", kPythonPluginFile,
                             " is not there or does not load (this kvlab may be built without the Python module, KVLAB_PYTHON off: "
                             "pybind11-dev, python3-dev, python3-numpy, python3-pandas); kvlab looked for:",
                             why, "\nexpected a build with the module (scripts/setup.sh, then cmake), or a built-in policy"));
    auto load = reinterpret_cast<LoadPolicyFileFn>(dlsym(lib, kLoadPolicyFileSymbol));
    if (!load) throw UsageError(str("--kv_cache.policy_file: ", kPythonPluginFile, " has no ", kLoadPolicyFileSymbol, "; expected the plugin of this kvlab"));
    static PythonPluginHost host;
    host.register_policy = &register_external_policy;
    host.policy_names = &kv_policy_names;
    host.external_policy_names = &external_policy_names;
    host.exe_dir = dir;
    std::string name, error;
    if (!load(&host, path, &name, &error)) throw UsageError(str("--kv_cache.policy_file: '", path, "' did not load: ", error));
    std::fprintf(stderr, "kvlab: policy '%s' from %s\n", name.c_str(), path.c_str());
    return name;
}

}  // namespace kv::cli
