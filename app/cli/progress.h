// Progress reporting for long CLI work: a redrawn bar on a terminal, plain lines otherwise
// (logs, CI), so output stays readable in both.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace kv::cli {

// Remaining time from the rate so far, given only once it is stable: past 5% of the work and 2 s,
// and within 20% of the estimate made at least a second earlier (projected to now). Early steps
// (model load, warm-up) mislead; once stable it stays shown.
class EtaEstimator {
   public:
    // Seconds left, or -1 while there is no stable estimate.
    double update(double elapsed_s, long long done, long long total);

   private:
    double prev_eta_ = -1, prev_at_ = -1;
    bool stable_ = false;
};

class Progress {
   public:
    // unit names what done/total count ("layer × chunk steps"); shown with the counts.
    explicit Progress(std::string title, FILE* out = stderr, std::string unit = "");
    ~Progress();
    // done out of total units; `what` names the current step.
    void update(long long done, long long total, const std::string& what);
    void finish();

   private:
    std::string title_;
    std::string unit_;
    EtaEstimator eta_;
    FILE* out_;
    bool tty_;
    bool finished_ = false;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace kv::cli
