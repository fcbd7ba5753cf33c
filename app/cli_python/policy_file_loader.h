// The host side of the Python plugin (python_plugin_api.h), shared by `kvlab` and `kvlab-gui`:
// opens libkvlab_python_cli.so and registers the policy class a .py file defines into this
// process's policy registry. Neither executable links the interpreter.
#pragma once

#include <string>

namespace kv {

// Registers the policy FILE defines and returns its name (the {policy} part of cache names).
// Throws kv::Error naming the file and what went wrong: no plugin in this build, or the
// file's own error with its Python traceback.
std::string load_python_policy_file(const std::string& path);

}  // namespace kv
