// `mpirun -np N kvlab sweep ...` (issue 23): the cells still missing from the target session are
// dealt round-robin over the ranks. Rank 0 runs its share into the target session itself; rank
// r > 0 runs its share into its own session file next to it (SESSION-STEM.rankR.kvlab, kept: it
// holds those runs' full telemetry), and at the end sends each run's status, summary and error to
// rank 0, which records them as runs of the target session (summary.dist names the rank, host and
// rank file). A stopped sweep continues as today: the target's done cells are skipped, and a rank
// reuses the cells its own file already holds instead of running them again.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dist_setup.h"
#include "sessions/sweep_grid.h"

namespace kv::storage {
class Session;
}

namespace kv::cli {

// The session file of rank `rank` for target `path`.
std::string rank_session_path(const std::string& path, int rank);

// Rank 0's pending cell indices (into `cells`) broadcast to every rank; returns this rank's share.
std::vector<size_t> share_pending_cells(const std::vector<size_t>& pending_on_rank0, const DistSetup& ds);

// After every rank ran its share: ranks > 0 send the runs of `mine` (cell index -> run id in their
// own session `own`), rank 0 records them into `target`. Returns the failed cells recorded (rank 0).
int gather_sweep_runs(const std::vector<sessions::SweepCell>& cells, const std::map<size_t, int64_t>& mine, storage::Session& own,
                      const std::string& own_path, const DistSetup& ds);

}  // namespace kv::cli
