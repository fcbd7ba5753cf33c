// Progress reporting for long CLI work: a redrawn bar on a terminal, plain lines otherwise
// (logs, CI), so output stays readable in both.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace kv::cli {

class Progress {
   public:
    explicit Progress(std::string title, FILE* out = stderr);
    ~Progress();
    // done out of total units; `what` names the current step.
    void update(long long done, long long total, const std::string& what);
    void finish();

   private:
    std::string title_;
    FILE* out_;
    bool tty_;
    bool finished_ = false;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace kv::cli
