// The `kvlab` command table. Each command lives in its own cmd_<name>.cpp and receives the
// process arguments from the position after its own name(s).
#pragma once

#include <string>
#include <vector>

#include "cli_args.h"

namespace kv::cli {

// Options every command accepts (threads, memory budget, device).
std::vector<OptionSpec> global_options();
// Apply the global options (set threads, install the budget); throws UsageError.
void apply_global_options(const Args& args);

int cmd_bench(int argc, char** argv, int first);  // cmd_bench.cpp: runs kvlab-bench (app/bench/)
int cmd_version(int argc, char** argv, int first);
int cmd_list(int argc, char** argv, int first);  // cmd_list.cpp: kvlab list policies|buffers|modes|presets
int cmd_eval(int argc, char** argv, int first, const std::string& mode);  // eval_long, infer, finetune_*
int cmd_generate(int argc, char** argv, int first);
int cmd_compare(int argc, char** argv, int first);
int cmd_sweep(int argc, char** argv, int first);  // cmd_sweep.cpp
int cmd_plot(int argc, char** argv, int first);   // cmd_plot.cpp
int cmd_calibrate(int argc, char** argv, int first);  // cmd_calibrate.cpp: the calibrations of engine/kv/calibration_registry.h

}  // namespace kv::cli
