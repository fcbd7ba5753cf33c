// Weight sanity at load: every floating-point weight finite and of plausible magnitude. A NaN
// or Inf block scale, a flipped exponent bit or a mislabelled type otherwise yields a run with
// plausible-looking but meaningless numbers. Checked once per load over the raw storage with
// integer bit tests (one compare per element, vectorised by the compiler).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/core/tensor.h"

namespace kv {

// Largest |w| accepted. Trained LLM weights stay far below it (norm gains and outlier
// channels reach tens to hundreds); a flipped exponent bit lands far above it.
constexpr float kMaxPlausibleWeight = 1e5f;

struct WeightCheckStats {
    int64_t elements = 0;  // floating-point elements checked
    double seconds = 0;
};

// Throws kv::Error "<source>: tensor 'NAME' element I (of N) is nan / 3.4e+38 ..." for the first
// offending element. f32, bf16 and f16 tensors on the host are checked; others are skipped.
WeightCheckStats check_weights(const std::map<std::string, Tensor>& weights, const std::string& source,
                               float max_abs = kMaxPlausibleWeight);

}  // namespace kv
