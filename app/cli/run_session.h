// Running a mode from the command line through the session machinery: the run is recorded into
// --session FILE (default: a new file under ~/.local/share/kvlab/, printed at start; generate
// without --session records nothing, and a run refused before it starts leaves no new file), progress
// shows as a bar, Ctrl-C cancels it (recorded as cancelled), and the result is printed.
#pragma once

#include "cli_args.h"

namespace kv::cli {

// mode: eval_long, infer, generate, finetune_*. Returns the exit code.
int run_mode_in_session(const Args& args, const std::string& mode);

}  // namespace kv::cli
