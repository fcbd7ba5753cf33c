// `kvlab bench fidelity` and `kvlab bench sweep`: what the research loop costs, as ratios
// measured in one run on this machine.
//   fidelity  an eval_long run with --fidelity true vs the same run without (target <= 2x),
//             in process, the model loaded once, best of N alternating repeats
//   sweep     `kvlab sweep` over N cells vs the same N cells as single `kvlab eval_long` runs,
//             each a separate process with its own session, as a user runs them (target <= 1.05x)
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace kv::bench {

struct ResearchBenchOptions {
    std::string model = "smollm2-135m";
    std::string data = "repeat";
    int64_t seq_length = 1024;
    int64_t num_samples = 1;
    int64_t chunk = 64;
    std::vector<std::string> caches = {"h2o-default"};  // fidelity: each; sweep: the grid's names
    std::vector<int64_t> cache_lengths = {256};
    int repeats = 3;
    std::string kvlab;       // sweep: the kvlab executable
    std::string dir = "/tmp";  // sweep: where the sessions go
};

struct ResearchBenchRow {
    std::string name;
    double with = 0, without = 0;  // seconds (best of the repeats)
    double target = 0;             // ratio with / without at most this
    double ratio() const { return without > 0 ? with / without : 0; }
    bool pass() const { return ratio() <= target; }
};

using BenchProgress = std::function<void(int, int, const std::string&)>;

std::vector<ResearchBenchRow> run_fidelity_bench(const ResearchBenchOptions& opt, const BenchProgress& progress);
std::vector<ResearchBenchRow> run_sweep_bench(const ResearchBenchOptions& opt, const BenchProgress& progress);

}  // namespace kv::bench
