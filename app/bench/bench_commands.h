// The `kvlab bench` sub-benchmarks of the kvlab-bench program (app/bench/: kvlab runs it for
// `kvlab bench`, app/cli/cmd_bench.cpp), one file each (cmd_bench_*.cpp); cmd_bench.cpp dispatches.
#pragma once

#include "bench/bench_table.h"
#include "app/cli/cli_args.h"

namespace kv::cli {

// kvlab-bench's command: argv[first] names the benchmark (cmd_bench.cpp).
int bench_main(int argc, char** argv, int first);
int bench_model(const Args& args);
int bench_cache(const Args& args);
int bench_policies(const Args& args);  // cmd_bench_cache.cpp
int bench_kivi(const Args& args);
int bench_telemetry(const Args& args);
int bench_grad(const Args& args);  // needs storage + sessions
int bench_fidelity(const Args& args);  // cmd_bench_research.cpp
int bench_sweep(const Args& args);     // cmd_bench_research.cpp (runs kvlab itself)
int bench_dist(const Args& args);      // cmd_bench_dist.cpp (under mpirun)
int bench_quest(const Args& args);     // cmd_bench_quest.cpp
int bench_families(const Args& args);  // cmd_bench_families.cpp
int bench_trace(const Args& args);     // cmd_bench_trace.cpp (needs the views)

// Prints the table, writes it as CSV to --csv and appends its Markdown section to --md
// (bench_output.cpp).
void emit_bench_table(const Args& args, const bench::BenchTable& t);

}  // namespace kv::cli
