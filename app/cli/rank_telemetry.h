// Per-rank telemetry of a data-parallel run into the run's one session (issue 23;
// docs/DISTRIBUTED.md "What the session records"): every rank records into its own session
// file (rank 0: the run's session; rank r: a private file in $TMPDIR); when the run is over,
// each rank r sends its closed file to rank 0 over the communicator and rank 0 imports its run
// as rank r's run (storage/rank_runs.h). Rank 0's own records never wait for this: a rank that
// died, or a transfer that fails, costs only that rank's telemetry.
#pragma once

#include <cstdint>
#include <string>

#include "dist_setup.h"
#include "storage/run_info.h"

namespace kv::cli {

// Collective over the ranks of `ds`; call on every rank once its run is final and, on ranks
// other than 0, after its session file was closed. `path`/`run`: this rank's session and run.
// Rank 0 prints one line per imported rank (or why not) to stderr. Never throws.
void share_rank_telemetry(const DistSetup& ds, const std::string& path, int64_t run, storage::RunStatus status);

}  // namespace kv::cli
