// The boundary between `kvlab` and its Python plugin (libkvlab_python_cli.so, built from
// python_plugin.cpp with the Python module's policies binding). kvlab does not link the Python
// interpreter: it opens the plugin with dlopen only when --kv_cache.policy_file is given, so the
// executable (and the GPU kit, and the .deb's hard dependencies) carry no libpython. The plugin
// registers its policies into the executable's registry through the host functions below.
#pragma once

#include <string>
#include <vector>

#include "engine/kv/policies/policy_runtime.h"

namespace kv::cli {

constexpr int kPythonPluginApi = 1;

struct PythonPluginHost {
    int api = kPythonPluginApi;
    void (*register_policy)(ExternalPolicySpec spec) = nullptr;  // the executable's registry
    const std::vector<std::string>& (*policy_names)() = nullptr;
    std::vector<std::string> (*external_policy_names)() = nullptr;
    std::string exe_dir;  // where kvlab runs from (the plugin finds the kvlab Python package from it)
};

// The plugin's one entry point: registers the policy FILE defines, sets *name to its name;
// returns false with *error set (the Python traceback included) when it did not load.
using LoadPolicyFileFn = bool (*)(const PythonPluginHost* host, const std::string& path, std::string* name, std::string* error);
constexpr const char* kLoadPolicyFileSymbol = "kvlab_python_load_policy_file";
constexpr const char* kPythonPluginFile = "libkvlab_python_cli.so";

}  // namespace kv::cli
