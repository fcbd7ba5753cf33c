// Kept-slot overlap of two runs of the same data: per layer, how many (cache step, cache row,
// token position) triples each run's cache held after each step, and how many both held. The
// runs' pass-0 cache steps are replayed through the one plan codec (replay_plan.h) and compared
// where they line up: after steps that end at the same token of the same sample (a step with
// input_pos 0 starts a new sample, empty cache), so runs chunked differently (a prefill step as
// long as the cache) are compared at the tokens both reached. A run whose plans share one row
// across heads counts that row for every row of the other. Pure: `kvlab diff` and the diff view
// read the rows.
#pragma once

#include <cstdint>
#include <vector>

#include "storage/rows.h"

namespace kv::storage {

struct KeptOverlap {
    int32_t layer = 0;
    int64_t steps = 0;              // steps compared (ending at the same token in both runs)
    int64_t held_a = 0, held_b = 0;  // (step, row, position) triples held after the step
    int64_t both = 0;                // held by both
    int64_t unmatched_steps = 0;     // steps of either run ending where the other has no step
    // Of what A kept, the share B kept too (and the other way round); NaN when nothing was held.
    double share_of_a() const;
    double share_of_b() const;
};

// One entry per layer either run has steps for, layer ascending. Rows that fail to decode end
// that layer's comparison (the steps before them count).
std::vector<KeptOverlap> kept_slot_overlap(const std::vector<CacheStepRow>& a, const std::vector<CacheStepRow>& b);

}  // namespace kv::storage
