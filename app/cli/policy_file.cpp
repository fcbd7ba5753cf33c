// --kv_cache.policy_file (see policy_file.h). The interpreter starts once and is never
// finalized: the registered scorers live until the process exits, and the GIL is released
// after loading so the run's worker thread can take it for every call.
#include "policy_file.h"

#include <cstdio>

#include "commands.h"
#include "engine/core/error.h"

#if KVLAB_HAVE_PYTHON
#include <pybind11/embed.h>

#include <filesystem>
#include <vector>

#include "kernels/cpu/cpu_variants.h"
#include "python/src/bindings.h"

// The policies half of kvlab._kvlab, over this executable's engine.
PYBIND11_EMBEDDED_MODULE(kvlab_cli_policies, m) { kv::python::bind_policies(m); }
#endif

namespace kv::cli {

#if KVLAB_HAVE_PYTHON
namespace py = pybind11;

namespace {
// kvlab/policy_loading.py of the build tree (bin/../python) or of the installed package.
std::string policy_loader_path() {
    const std::string exe = cpu::executable_dir();
    std::vector<std::string> tried;
    for (const std::string& p : {exe + "/../python/kvlab/policy_loading.py", exe + "/../lib/python3/dist-packages/kvlab/policy_loading.py"}) {
        if (std::filesystem::exists(p)) return p;
        tried.push_back(p);
    }
    throw UsageError(str("--kv_cache.policy_file: the kvlab Python package was not found (looked for ", tried[0], " and ", tried[1],
                         "); expected the build tree's python/ folder or the installed package"));
}
}  // namespace

std::string load_policy_file(const std::string& path) {
    static bool loaded = false;
    if (loaded) throw UsageError("--kv_cache.policy_file: given twice; expected one policy file per command");
    loaded = true;
    const std::string loader = policy_loader_path();
    py::initialize_interpreter(false);  // the CLI keeps its own Ctrl-C handling
    std::string name;
    try {
        py::object util = py::module_::import("importlib.util");
        py::object spec = util.attr("spec_from_file_location")("kvlab_policy_loading", loader);
        py::object mod = util.attr("module_from_spec")(spec);
        spec.attr("loader").attr("exec_module")(mod);
        name = mod.attr("load_file")(py::module_::import("kvlab_cli_policies"), path).cast<std::string>();
    } catch (py::error_already_set& e) {
        // Our own refusals (no such file, no class) are one line; anything else keeps its traceback.
        const std::string text = e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError) ? py::str(e.value()).cast<std::string>() : e.what();
        throw UsageError(str("--kv_cache.policy_file: '", path, "' did not load: ", text));
    }
    PyEval_SaveThread();  // the GIL is free from here on; scorers take it per call
    std::fprintf(stderr, "kvlab: policy '%s' from %s\n", name.c_str(), path.c_str());
    return name;
}
#else
std::string load_policy_file(const std::string& path) {
    throw UsageError(str("--kv_cache.policy_file '", path,
                         "': this kvlab was built without the Python module (KVLAB_PYTHON off: pybind11-dev, python3-dev, "
                         "python3-numpy, python3-pandas); expected a build with it (scripts/setup.sh, then cmake), or a built-in policy"));
}
#endif

}  // namespace kv::cli
