// The process around a kvlab program (kvlab, kvlab-bench): file-size and allocator settings, the
// OpenMP wait policy, and every error turned into one message and an exit code (0 ok, 1 run-time
// error, 2 usage error), so both programs start and fail the same way.
#pragma once

namespace kv::cli {

// Runs run(argc, argv) inside that setting; returns the process exit code.
int guarded_main(int argc, char** argv, int (*run)(int, char**));

}  // namespace kv::cli
