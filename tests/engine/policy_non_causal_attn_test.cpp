// non-causal-attn against kvpress' NonCausalAttnPress in f64: tiles of C positions; inside a
// tile every query attends to every key of the tile (unscaled dot products, softmax over the
// tile's keys), summed over the tile's queries and averaged over the group's heads; times the
// value norm; average-pooled over 3 neighbours in position order (zero padding counted);
// z-normalised over every cached token of the layer (torch's unbiased std).
#include "policy_references.h"

namespace kv::test {
namespace {

TEST(NonCausalAttn, ScoresAndChoicesEqualTheF64Reference) {
    // tiles of 5 positions: tiles straddle chunks and the open tile is rescored as it fills
    check_policy_against_reference(
        "non-causal-attn-default", [](KVCacheConfig& c) { c.policy_options = {{"nca_chunk_size", 5}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return nca_reference(h, 5); }, {4, 3, 4, 2, 4, 1, 5, 1}, 2e-5);
}

TEST(NonCausalAttn, DefaultTileCoversTheWholeShortSequence) {
    check_policy_against_reference("non-causal-attn-default", [](KVCacheConfig&) {},
                                   [](const LayerHarness& h, int64_t, int64_t) { return nca_reference(h, 256); }, {4, 3, 4, 2}, 2e-5);
}

}  // namespace
}  // namespace kv::test
