// kvlab._kvlab: the compiled half of `import kvlab` (python/kvlab/__init__.py is the other).
#include <pybind11/pybind11.h>

#include "engine/core/error.h"
#include "python/src/bindings.h"

PYBIND11_MODULE(_kvlab, m) {
    m.doc() = "kvlab engine, runs and sessions (use the kvlab package, not this module)";
    m.attr("__version__") = KVLAB_VERSION;
    // kv::Error carries the CLI's message (what was wrong, what was expected): Python sees it
    // as a ValueError with that text.
    pybind11::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const kv::Error& e) {
            PyErr_SetString(PyExc_ValueError, e.what());
        }
    });
    kv::python::bind_sessions(m);
    kv::python::bind_runs(m);
    kv::python::bind_policies(m);
}
