// Difference map: two runs of the same model and data, one eviction map showing, per (chunk
// step, token position) of one layer and KV head, whether the token is held by both runs, only
// by run A, only by run B (or by neither), with the counts over the whole map. Built from the
// two runs' EvictionData (views/eviction_map.h); reached from the compare view. Pure: no
// ImGui state, no storage reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "views/colormap.h"
#include "views/eviction_map.h"

namespace kv::views {

// Steps [from, to) during which a token is held, per token position of one layer's cache row
// (a token, once evicted, never returns). Empty (from >= to) for positions not written.
struct HeldSteps {
    int32_t from = 0, to = 0;
};
std::vector<HeldSteps> held_steps(const EvictionLayer& layer, int row);

struct DifferenceCounts {
    int64_t both = 0, only_a = 0, only_b = 0;  // (step, position) pairs over the whole map
};

// Colours of the three classes (the legend's and the texture's); "neither" is kNoDataColour.
constexpr Colour kDiffBothColour = pack_rgba(215, 215, 220);
constexpr Colour kDiffOnlyAColour = pack_rgba(66, 146, 235);
constexpr Colour kDiffOnlyBColour = pack_rgba(240, 150, 50);

struct DifferenceImage {
    int width = 0, height = 0;  // texels: column x = steps [x * steps_per_texel, ...), row y = positions
    int steps = 0;
    int64_t tokens = 0;
    int steps_per_texel = 1;
    int64_t tokens_per_texel = 1;
    DifferenceCounts counts;
    std::vector<uint8_t> rgba;  // (height, width, 4): the classes' colours mixed by their share of the texel
    std::string error;          // why there is no map ("" when there is one)
};
// Layer `layer`, cache row `row` of sequence `seq_a` of A and `seq_b` of B. The runs must cut
// the sample the same way (same steps and positions), else `error` says how they differ.
// Binning as the eviction map's: powers of two until the texture fits max_width x max_height.
DifferenceImage build_difference_image(const EvictionData& a, int seq_a, const EvictionData& b, int seq_b, int layer, int row,
                                       int max_width = 2048, int max_height = 2048);

}  // namespace kv::views
