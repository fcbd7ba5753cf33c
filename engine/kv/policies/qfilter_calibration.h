// Q-Filter calibration (Godey et al. 2025, "Q-Filters: Leveraging QK Geometry for Efficient KV
// Cache Compression"): the model runs over calibration windows without a cache; every layer's
// post-RoPE queries (the ones attention multiplies with the cached, rotated keys) are folded
// into each KV head's second-moment matrix sum q q^T over the head's R query heads and every
// position, and each head's filter is that matrix's top eigenvector (qfilter_direction). Nothing
// is downloaded. docs/POLICIES.md#qfilter.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/kv/calibration_registry.h"
#include "engine/kv/policies/qfilter_filters.h"
#include "engine/model/transformer.h"

namespace kv {

// Per (layer, KV head): C (D x D) and s (D) over the queries seen so far.
struct QueryMoments {
    int64_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0;
    std::vector<double> C;  // (layers, kv_heads, D, D)
    std::vector<double> s;  // (layers, kv_heads, D)
};

// Runs `model` over each window (one forward from position 0) and accumulates the moments of
// its post-RoPE queries; progress(done, total) after each window.
QueryMoments collect_query_moments(const Transformer& model, const std::vector<std::vector<int32_t>>& windows,
                                   const std::function<void(int64_t, int64_t)>& progress = {});
// The filters of the moments (one qfilter_direction per head).
QFilters qfilters_from_moments(const QueryMoments& m);

// `kvlab calibrate qfilter`: the moments over the run's text windows, their filters written to
// run.output; returns the filter count, size and the forward and direction times.
std::string run_qfilter_calibration(const CalibrationRun& run);

}  // namespace kv
