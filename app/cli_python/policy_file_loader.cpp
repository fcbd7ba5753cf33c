// Host side of the Python plugin (see policy_file_loader.h).
#include "app/cli_python/policy_file_loader.h"

#include <dlfcn.h>

#include <vector>

#include "app/cli_python/python_plugin_api.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_registry.h"
#include "kernels/cpu/cpu_variants.h"

namespace kv {

std::string load_python_policy_file(const std::string& path) {
    using namespace kv::cli;
    static LoadPolicyFileFn load = nullptr;
    static PythonPluginHost host;
    if (!load) {
        const std::string dir = cpu::executable_dir();
        // Beside the executable in a build tree, in lib/kvlab when installed (as the kernel plugins).
        const std::vector<std::string> candidates = {dir + "/" + kPythonPluginFile, dir + "/../lib/kvlab/" + kPythonPluginFile};
        void* lib = nullptr;
        std::string why;
        for (const std::string& p : candidates) {
            if (lib) break;
            // Global: numpy's extension modules resolve libpython's symbols through it.
            lib = dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL);
            if (!lib) why += str("\n  ", p, ": ", dlerror());
        }
        if (!lib)
            throw Error(str("policy file '", path, "': the Python plugin ", kPythonPluginFile,
                            " is not there or does not load (this kvlab may be built without the Python module, KVLAB_PYTHON off: "
                            "pybind11-dev, python3-dev, python3-numpy, python3-pandas); kvlab looked for:",
                            why, "\nexpected a build with the module (scripts/setup.sh, then cmake), or a built-in policy"));
        load = reinterpret_cast<LoadPolicyFileFn>(dlsym(lib, kLoadPolicyFileSymbol));
        if (!load) throw Error(str("policy file: ", kPythonPluginFile, " has no ", kLoadPolicyFileSymbol, "; expected the plugin of this kvlab"));
        host.register_policy = &register_external_policy;
        host.policy_names = &kv_policy_names;
        host.external_policy_names = &external_policy_names;
        host.exe_dir = dir;
    }
    std::string name, error;
    if (!load(&host, path, &name, &error)) throw Error(str("policy file '", path, "' did not load: ", error));
    return name;
}

}  // namespace kv
