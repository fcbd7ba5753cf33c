// `kvlab bench policies`: eval throughput (the eval driver's chunked forward with the
// next-token loss, the run shape of `kvlab eval_long`) of every registered policy relative to
// lastrec on the same buffer, model, sequence, cache length and chunk plan.
//
// What a loaded, shared machine can show: per run the process CPU time of exactly the measured
// forward (with one kernel thread it is the work, not the wait for a core), in interleaved
// rounds (lastrec, p, lastrec, p, ...) so that drifting load hits both alike; per policy the
// median of the per-round ratios baseline CPU / policy CPU and their min-max, plus the
// wall-clock columns. A lastrec-vs-lastrec row is the noise control. lastrec runs each policy's
// own chunk plan (pyramidkv's and duo's plans are cut at their layers' lengths). Target >= 0.9x (CPU) for
// single-pass policies; a two-pass policy (kvzip) reports its own factor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_table.h"

namespace kv::bench {

struct PolicyBenchOptions {
    std::string model = "smollm2-135m";
    int64_t tokens = 2048;
    int64_t cache_length = 512;
    int64_t chunk = 128;
    int repeats = 3;  // rounds of (lastrec, policy) per policy
    // empty = every registered policy that evicts (not dense, not quest, which never evicts);
    // duo runs with its registry gates "pattern:10" (every other KV head a retrieval head) and
    // streaming heads of duo_sinks + duo_recent = half the cache (16 sinks), so both kinds of head exist.
    std::vector<std::string> policies;
};

struct PolicyBenchRow {
    std::string policy;    // cache name, e.g. "h2o-default"
    std::string baseline;  // e.g. "lastrec-default"
    std::string note;      // e.g. " [44 chunks of 14-63 (first 63), lastrec too]", " [+ reconstruction pass]"
    int64_t chunks = 0;    // chunks of the plan both ran with
    std::vector<double> base_cpu, policy_cpu;    // seconds of process CPU time per round
    std::vector<double> base_wall, policy_wall;  // seconds of wall time per round
    std::vector<uint64_t> kept_hash;             // per round: FNV-1a of every layer's slot positions after the policy's run
    double cpu_ratio_median = 0, cpu_ratio_min = 0, cpu_ratio_max = 0;  // base / policy per round
    double wall_ratio_median = 0;
    double target = 0.9;  // on cpu_ratio_median; 0 = none (two-pass)
    bool pass() const { return target <= 0 || cpu_ratio_median >= target; }
};

// What a calibrated policy needed before it could run (qfilter: its filters), measured once.
struct CalibrationCost {
    std::string policy;
    double cpu = 0, wall = 0;  // seconds
};

struct PolicyBenchResult {
    std::vector<PolicyBenchRow> rows;  // the noise control (lastrec / lastrec) first
    std::vector<CalibrationCost> calibration;
    double load_start[3] = {0, 0, 0}, load_end[3] = {0, 0, 0};  // getloadavg, -1 when unknown
    int threads = 0;
    int64_t tokens = 0, cache_length = 0, chunk = 0;
    std::string model;
};

PolicyBenchResult run_policy_bench(const PolicyBenchOptions& opt, const std::function<void(int, int, const std::string&)>& progress);

// The table `kvlab bench policies` prints: a header (model, shape, threads, load at start and
// end), one row per policy (CPU ms medians, CPU ratio median [min-max], wall tokens/s and wall
// ratio, target), then the per-round CPU times every ratio is computed from and the per-round
// kept-set hashes (equal before and after a change: the same tokens kept in every slot).
std::string format_policy_bench(const PolicyBenchResult& r);
// Its parts: the load line (console only: it describes the run, not the result), the table
// (also --csv / --md) and the per-round CPU times.
std::string format_policy_load(const PolicyBenchResult& r);
BenchTable policy_bench_table(const PolicyBenchResult& r);
std::string format_policy_rounds(const PolicyBenchResult& r);

// Median of v (the mean of the two middle values for an even count); v must not be empty.
double median_of(std::vector<double> v);

}  // namespace kv::bench
