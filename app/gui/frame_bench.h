// `kvlab-gui --bench-frames`: frame times of the views under the real Qt + OpenGL host (on
// Xvfb + llvmpipe in CI): the eviction map of a synthetic 128k-token 24-layer run, the memory
// timeline of 10M allocator events, and the worst frame while a `small` run streams into a
// session. Prints one line per case (median / p95 / worst ms, ratio to the 10 Hz budget); the
// trace view's scenarios print the bench table that scripts/performance.sh also takes as Markdown.
#pragma once

#include <cstdint>
#include <string>

namespace kv::gui {

struct FrameBenchOptions {
    int frames = 60;       // per scenario
    std::string session;   // synthetic session to reuse (written and kept when missing; "" = temporary)
    std::string only;      // scenario group filter ("memory", "eviction", ...; "" = all)
    bool live = true;      // also time frames while a `small` run streams
    int64_t trace_spans = 10'000'000;  // only == "trace": the synthetic run's spans
    std::string md;        // only == "trace": append the table as Markdown here ("" = print only)
};

int runFrameBench(const FrameBenchOptions& o);

}  // namespace kv::gui
