// What this machine can do, measured in the same run as the thing being judged: a raw oneDNN
// matmul (the compute ceiling for our matmul op) and a streaming triad (the bandwidth
// ceiling for memory-bound ops). Benchmarks report ratios to these, never bare times.
#pragma once

#include <functional>
#include <string>

#include "kernels/common/dtype.h"

namespace kv::bench {

// Best seconds per call of fn over batches lasting at least min_seconds in total
// (after one warm-up call).
double time_best(const std::function<void()>& fn, double min_seconds = 0.3, int min_reps = 3);

// Raw oneDNN matmul M x K @ K x N (row-major, dtype f32 or bf16 inputs, f32 output),
// returning a callable that runs it once on preallocated buffers.
class RawMatmul {
   public:
    RawMatmul(int64_t M, int64_t N, int64_t K, DType in_dtype);
    ~RawMatmul();
    RawMatmul(const RawMatmul&) = delete;
    RawMatmul& operator=(const RawMatmul&) = delete;
    void run();
    std::string impl() const;
    // Empty, or why the baseline differs from what was asked (bf16 where oneDNN offers none).
    std::string note() const;

   private:
    struct Impl;
    Impl* impl_;
};

// Streaming triad a[i] = b[i] + s * c[i] over three float arrays of `bytes_per_array` bytes,
// all threads. Returns the best GB/s (STREAM byte counting: 3 arrays per pass).
double triad_gbps(size_t bytes_per_array, double min_seconds = 0.3);

// One line naming the machine a benchmark ran on: CPU model, threads, and the CPU kernel
// variant in use with why it was chosen (ratios differ per variant; docs/PERFORMANCE.md).
std::string machine_line();

}  // namespace kv::bench
