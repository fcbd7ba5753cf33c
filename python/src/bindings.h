// The parts of the extension module `kvlab._kvlab`, one per concept; module.cpp calls each.
#pragma once

#include <pybind11/pybind11.h>

namespace kv::python {

void bind_sessions(pybind11::module_& m);  // session_data.cpp: read-only session -> columns
void bind_runs(pybind11::module_& m);      // runs.cpp: eval_long / sweep through RunManager
void bind_policies(pybind11::module_& m);  // policies.cpp: Python classes as KV-cache policies

}  // namespace kv::python
