// libkvlab_python_cli.so (see python_plugin_api.h): embeds the interpreter, runs the kvlab
// package's policy loader on a file and registers its class through the host. The interpreter
// starts once and is never finalized: the registered scorers live until the process exits, and
// the GIL is released after each load so a run's worker thread can take it for every call.
#include <pybind11/embed.h>

#include <filesystem>
#include <vector>

#include "app/cli_python/python_plugin_api.h"
#include "engine/core/error.h"
#include "engine/kv/policies/policy_registry.h"
#include "python/src/bindings.h"

namespace {
const kv::cli::PythonPluginHost* g_host = nullptr;
}

// The policies binding (python/src/policies.cpp) registers through these: here they forward to
// the executable's registry, which this library does not link.
namespace kv {
void register_external_policy(ExternalPolicySpec spec) { g_host->register_policy(std::move(spec)); }
const std::vector<std::string>& kv_policy_names() { return g_host->policy_names(); }
std::vector<std::string> external_policy_names() { return g_host->external_policy_names(); }
}  // namespace kv

// The policies half of kvlab._kvlab, over the executable's engine.
PYBIND11_EMBEDDED_MODULE(kvlab_cli_policies, m) { kv::python::bind_policies(m); }

namespace py = pybind11;

extern "C" __attribute__((visibility("default"))) bool kvlab_python_load_policy_file(const kv::cli::PythonPluginHost* host,
                                                                                      const std::string& path, std::string* name,
                                                                                      std::string* error) {
    if (!host || host->api != kv::cli::kPythonPluginApi) {
        *error = "the Python plugin does not match this kvlab (plugin API " + std::to_string(kv::cli::kPythonPluginApi) + ")";
        return false;
    }
    g_host = host;
    // kvlab/policy_loading.py of the build tree (bin/../python) or of the installed package.
    std::string loader;
    const std::vector<std::string> candidates = {host->exe_dir + "/../python/kvlab/policy_loading.py",
                                                 host->exe_dir + "/../lib/python3/dist-packages/kvlab/policy_loading.py"};
    for (const std::string& p : candidates)
        if (loader.empty() && std::filesystem::exists(p)) loader = p;
    if (loader.empty()) {
        *error = "the kvlab Python package was not found (looked for " + candidates[0] + " and " + candidates[1] +
                 "); expected the build tree's python/ folder or the installed package";
        return false;
    }
    // The first file starts the interpreter (the host keeps its own Ctrl-C handling) and the
    // GIL is given up after it; later files (the app loads several) take the GIL back.
    static bool started = false;
    PyGILState_STATE gil{};
    if (!started) py::initialize_interpreter(false);
    else gil = PyGILState_Ensure();
    bool ok = true;
    try {
        py::object util = py::module_::import("importlib.util");
        py::object spec = util.attr("spec_from_file_location")("kvlab_policy_loading", loader);
        py::object mod = util.attr("module_from_spec")(spec);
        spec.attr("loader").attr("exec_module")(mod);
        *name = mod.attr("load_file")(py::module_::import("kvlab_cli_policies"), path).cast<std::string>();
    } catch (py::error_already_set& e) {
        // Our own refusals (no such file, no class) are one line; anything else keeps its traceback.
        *error = e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError) ? py::str(e.value()).cast<std::string>() : e.what();
        ok = false;
    } catch (const std::exception& e) {
        *error = e.what();
        ok = false;
    }
    if (!started) {
        started = true;
        PyEval_SaveThread();  // the GIL is free from here on; scorers take it per call
    } else {
        PyGILState_Release(gil);
    }
    return ok;
}
