// Summary statistics of a score array (min, max, mean, standard deviation, p10/p50/p90/p99),
// recorded for every (layer, chunk) even when the full array is not kept.
// Quantiles are exact (nearest-rank on the sorted finite values) up to kExactQuantileLimit
// values; larger arrays use an evenly strided sample of that many values, which bounds the
// cost per call. Must not allocate on the hot path beyond a reused thread-local scratch buffer.
#pragma once

#include <cstddef>

#include "engine/telemetry/event_types.h"

namespace kv::trace {

constexpr size_t kExactQuantileLimit = size_t(1) << 16;

// Statistics of values[0..n); NaN/inf are counted in `nonfinite` and otherwise ignored.
ScoreStats score_stats(const float* values, size_t n);

}  // namespace kv::trace
