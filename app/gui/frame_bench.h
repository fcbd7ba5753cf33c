// `kvlab-gui --bench-frames`: frame times of the views under the real Qt + OpenGL host (on
// Xvfb + llvmpipe in CI): the eviction map of a synthetic 128k-token 24-layer run, the memory
// timeline of 10M allocator events, and the worst frame while a `small` run streams into a
// session. Prints one line per case (median / p95 / worst ms, ratio to the 10 Hz budget).
#pragma once

namespace kv::gui {

int runFrameBench(int frames);

}  // namespace kv::gui
