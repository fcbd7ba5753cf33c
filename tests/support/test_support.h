// Shared test helpers: per-run random seeds (fresh inputs every run, reproducible with
// KVLAB_TEST_SEED=N), random tensors, and comparisons that report the worst elements.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "engine/core/tensor.h"

namespace kv::test {

// Seed for a named test: the run's base seed (KVLAB_TEST_SEED, else random and printed once)
// mixed with the name, so every test gets its own stream.
uint64_t seed_for(const std::string& name);
uint64_t base_seed();

// Uniform values in [lo, hi) generated in f64 and stored in `dtype` (so low-precision inputs
// are exactly representable and the reference sees the same numbers).
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0,
                     const TensorOptions& opt = {});

struct Comparison {
    double max_abs_err = 0;  // max |got - ref|
    double ref_scale = 0;    // max |ref|
    double rel_err = 0;      // max_abs_err / max(ref_scale, tiny)
    int64_t worst = -1;      // flat index of the largest error
    bool nonfinite_mismatch = false;  // got NaN/inf where ref is finite (or vice versa)
    std::string report;      // first few pairs and the worst one
};

// Compares elementwise (shapes must match); both are read as f64.
Comparison compare(const Tensor& got, const Tensor& ref, int show = 5);

}  // namespace kv::test
