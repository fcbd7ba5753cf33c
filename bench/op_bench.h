// `kvlab bench ops`: our ops against the machine's ceilings measured in the same run.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kv::bench {

struct OpBenchRow {
    std::string name;     // "matmul f32 1024^3"
    std::string unit;     // "GFLOP/s" or "GB/s"
    double ours = 0;      // achieved rate
    double ceiling = 0;   // raw oneDNN rate or triad bandwidth
    std::string ceiling_name;
    double target = 0;    // required ours/ceiling
    double ratio() const { return ceiling > 0 ? ours / ceiling : 0; }
    bool pass() const { return ratio() >= target; }
};

struct OpBenchOptions {
    bool quick = false;   // smaller shapes and shorter timing (smoke tests)
    double min_seconds = 0.3;
};

// Runs every case; `progress(done, total, name)` is called before each measurement.
std::vector<OpBenchRow> run_op_bench(const OpBenchOptions& opt,
                                     const std::function<void(int, int, const std::string&)>& progress);

}  // namespace kv::bench
