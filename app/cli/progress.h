// Progress reporting for long CLI work: a redrawn bar on a terminal, plain lines otherwise
// (logs, CI), so output stays readable in both.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace kv::cli {

class Progress {
   public:
    // unit names what done/total count ("layer × chunk steps"); shown with the counts.
    explicit Progress(std::string title, FILE* out = stderr, std::string unit = "");
    ~Progress();
    // done out of total units; `what` names the current step.
    void update(long long done, long long total, const std::string& what);
    void finish();

   private:
    // The ETA shown once the estimate is stable: past 5% and 2 s, and within 20% of the
    // estimate made at least a second earlier (early steps -- model load, warm-up -- mislead).
    double stable_eta(double elapsed, long long done, long long total);

    std::string title_;
    std::string unit_;
    double prev_eta_ = -1, prev_eta_at_ = -1;
    bool eta_stable_ = false;
    FILE* out_;
    bool tty_;
    bool finished_ = false;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace kv::cli
