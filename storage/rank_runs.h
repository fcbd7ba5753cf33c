// Data-parallel runs in one session (issue 23): rank 0's run is the run; every other rank's
// telemetry (spans, memory events, cells, metrics, logs) is imported after the run as a "rank
// run", a runs row of its own whose config says `dist.rank` and `dist.rank_of` (rank 0's run
// id). No schema change: each rank keeps its own run id, so its memory events keep their own
// per-process totals, block states and time origin, and every reader, export and view works on
// a rank exactly as on a run. Listings hide rank runs (they belong to their run); rank_runs()
// maps a run to the run ids of its ranks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "storage/run_info.h"

namespace kv::storage {

struct RankImport {
    int64_t run = 0;  // the rank run's id in the target session
    int64_t spans = 0, memory_events = 0, metrics = 0;
};

// Copies run `src_run` of the session file `src_path` (a rank's own session, closed by its
// writer) into the session at `dst_path` as rank `rank` of run `parent_run`. A source run that
// never finished (its rank died) is stored `crashed`. One transaction: all or nothing. Throws
// SessionError naming the file when either session cannot be read or written.
RankImport import_rank_run(const std::string& dst_path, int64_t parent_run, int rank, const std::string& src_path,
                           int64_t src_run);

// The rank a run's config names (0 for an ordinary run) and the run it belongs to (0: none).
int run_rank(const RunInfo& r);
int64_t rank_run_parent(const RunInfo& r);
inline bool is_rank_run(const RunInfo& r) { return rank_run_parent(r) != 0; }

// Run ids of `run`'s ranks, indexed by rank (index 0 is `run`); a rank whose telemetry never
// arrived is 0. Size 1 for a one-process run. `runs`: the session's runs.
std::vector<int64_t> rank_runs(const std::vector<RunInfo>& runs, int64_t run);

}  // namespace kv::storage
