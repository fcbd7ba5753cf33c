// Data parallelism from the command line (engine/dist): installs the process communicator for
// a command run by mpirun (or asked for with --dist.backend) and says which rank this is.
// Rank 0 prints and records the session; the other ranks stay quiet (docs/DISTRIBUTED.md).
#pragma once

#include <string>

#include "engine/run/run_config.h"

namespace kv::cli {

struct DistSetup {
    bool active = false;  // a communicator is installed
    int rank = 0;
    int ranks = 1;
    std::string backend = "none";
};

// `command`: the command's name, for messages. `splits_work`: the command divides its work
// over ranks (finetune_*, sweep, bench dist); others refuse to run under several ranks.
// Sets cfg.dist.ranks. Throws UsageError / Error with one clear message.
DistSetup setup_dist(RunConfig& cfg, const std::string& command, bool splits_work);

}  // namespace kv::cli
