// compactor against kvpress' CompactorPress in f64: over the cached tokens outside the
// protected ends (positions < sinks_start, and the sinks_end newest), b * z(leverage) +
// z(pool3(tile attention x |v|)), both z-normalised over the layer; the protected tokens take
// the maximum + 1. b: the option, or 1 - T / P when it is negative.
#include "policy_references.h"

namespace kv::test {
namespace {

TEST(Compactor, ScoresAndChoicesEqualTheF64Reference) {
    // tiles of 5, sketch 6, 2 sinks and the 3 newest protected, b = 1 - T / P
    check_policy_against_reference(
        "compactor-default",
        [](KVCacheConfig& c) {
            c.policy_options = {{"nca_chunk_size", 5}, {"leverage_sketch", 6}, {"compactor_sinks_start", 2}, {"compactor_sinks_end", 3}};
        },
        [](const LayerHarness& h, int64_t, int64_t) { return compactor_reference(h, 5, 6, -1, 2, 3); }, {4, 3, 4, 2, 4, 1, 5, 1}, 2e-5);
}

TEST(Compactor, DefaultsAndAFixedBlendingEqualTheF64Reference) {
    check_policy_against_reference("compactor-default", [](KVCacheConfig&) {},
                                   [](const LayerHarness& h, int64_t, int64_t) { return compactor_reference(h, 256, 48, -1, 8, 4); },
                                   {4, 3, 4, 2}, 2e-5);
    check_policy_against_reference(
        "compactor-default", [](KVCacheConfig& c) { c.policy_options = {{"compactor_blending", 0.35}, {"leverage_sketch", 6}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return compactor_reference(h, 256, 6, 0.35, 8, 4); }, {4, 3, 4, 2}, 2e-5);
}

}  // namespace
}  // namespace kv::test
