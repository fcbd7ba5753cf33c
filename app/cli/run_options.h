// Building a RunConfig from the command line: MODE MODEL plus every dotted run option, with
// --config run.json read first so flags override it.
#pragma once

#include "cli_args.h"
#include "engine/run/run_config.h"

namespace kv::cli {

// Global options + every run option + --config + --session.
std::vector<OptionSpec> run_option_specs();
// Throws UsageError for bad values (the engine's message, naming the option).
RunConfig run_config_from_args(const Args& args, const std::string& mode);
// Whether a run option (of the option table's `group`) does anything in `mode`: --help lists
// only those (eval_long: no training, gradient or generation options).
bool run_option_applies(const std::string& mode, const std::string& group, const std::string& name);
void print_run_help(const std::string& mode);

}  // namespace kv::cli
