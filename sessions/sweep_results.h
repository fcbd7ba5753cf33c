// Results of a sweep read back from its session: which cells are done (by identity, so a
// resumed sweep finds them), the metric of each cell and its difference to the dense
// reference, formatted as an aligned table, CSV, JSON or Markdown. Also the per-run values
// `kvlab plot` draws (any option, any summary metric).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "sweep_grid.h"

namespace kv::storage {
class Session;
}

namespace kv::sessions {

// Identity -> id of the newest done run with that configuration.
std::map<std::string, int64_t> done_runs_by_identity(storage::Session& session);
// Identity -> ids of every done run with that configuration, ascending.
std::map<std::string, std::vector<int64_t>> all_done_runs_by_identity(storage::Session& session);

// An option's value for a run as text: any run option, plus kv_cache.buffer, kv_cache.policy
// and kv_cache.ratio (cache_length / data.seq_length; 1 for dense). Throws kv::Error for an
// unknown name.
std::string run_option_value(const RunConfig& cfg, const std::string& option);

// Whether the run's value of every option in `where` is one of its alternatives ("V1|V2|..."),
// as `kvlab plot --where` selects runs.
bool run_matches_where(const RunConfig& cfg, const std::vector<std::pair<std::string, std::string>>& where);

struct SweepTableRow {
    std::vector<std::string> cells;  // one per column before the numbers
    int64_t run = 0;                 // 0: not run (yet); else the newest done run of the cell
    std::string status;              // done; else the newest run's status (failed, ...) or missing
    // Metric of the cell and of its dense reference: the mean over every done run of the
    // configuration (a cell run twice is not two cells, nor its newest run alone).
    double value = 0, reference = 0;
    bool has_value = false, has_reference = false;
    int n = 0;      // done runs whose metric is in `value`
    double se = 0;  // their standard error of the mean (0 for one run)
    std::vector<int64_t> runs;  // all done runs of the cell, ascending
};

struct SweepTable {
    std::vector<std::string> columns;  // kv_cache.name, then the other axes
    std::string metric;                // summary key, e.g. perplexity
    std::vector<SweepTableRow> rows;
};

// `metric` "auto": perplexity when the runs have it, else copy_token_accuracy (repeat), else
// accuracy, else mean_loss.
SweepTable make_sweep_table(const std::vector<SweepCell>& cells, const std::vector<SweepAxis>& axes,
                            storage::Session& session, const std::string& metric = "auto");

// format: table | csv | json | md. When a cell was run more than once, n and the standard
// error follow the metric (JSON: n, se and runs always), and the aligned table says so below.
// Throws kv::Error for another format.
std::string format_sweep_table(const SweepTable& t, const std::string& format);

// The leaderboard of a sweep over methods and cache sizes (`kvlab sweep --format leaderboard`),
// as kvpress reports RULER: a Markdown table, one row per kv_cache.name, one column per
// kv_cache.ratio (else kv_cache.compression_ratio, kv_cache.cache_length, or
// kv_cache.score_threshold: rows then named dms(<cache>)), each cell the mean over the tasks (every other
// axis: data, data.seq_length, ...) of the cells' metric, with the standard error over tasks
// and their count. Dense fills every column (its cache does not depend on the ratio). Throws
// kv::Error when the table has no kv_cache.name or cache-size column.
std::string format_sweep_leaderboard(const SweepTable& t);

}  // namespace kv::sessions
