// leverage against kvpress' LeverageScorePress in f64: per (b, g) row, the cached keys centred
// over the sequence, sketched on the right by the documented Gaussian Phi (docs/POLICIES.md
// #leverage: Box-Muller over splitmix64 of (layer, head, index), / sqrt(k)), leverage
// y^T (Y^T Y + 0.01 I)^-1 y by an explicit Gauss-Jordan inverse, clamped at 0, z-normalised
// over the layer (unbiased std). The harness feeds unrotated keys (no RoPE frequencies).
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> leverage_reference(const LayerHarness& h, int64_t k) {
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0), all;
    std::vector<std::vector<int64_t>> slots;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        slots.push_back(ref_slots_by_position(h, r, [](int32_t) { return true; }));
        for (double x : ref_leverage(h, r, slots.back(), k)) all.push_back(x);
    }
    ref_z_normalise(all);
    size_t i = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : slots[size_t(r)]) out[size_t(r * h.L + j)] = all[i++];
    return out;
}

TEST(Leverage, SketchedScoresAndChoicesEqualTheF64Reference) {
    // kvpress' sketch of 48 columns over 16-dimensional keys (rank 16: the 0.01 ridge matters)
    check_policy_against_reference("leverage-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 48); },
                                   {4, 3, 4, 2, 4, 1, 5, 1}, 2e-5);
}

TEST(Leverage, SmallSketchAndNoSketchEqualTheF64Reference) {
    check_policy_against_reference(
        "leverage-default", [](KVCacheConfig& c) { c.policy_options = {{"leverage_sketch", 6}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 6); }, {4, 3, 4, 2}, 2e-5);
    check_policy_against_reference(
        "leverage-default", [](KVCacheConfig& c) { c.policy_options = {{"leverage_sketch", 0}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return leverage_reference(h, 0); }, {4, 3, 4, 2}, 2e-5);
}

}  // namespace
}  // namespace kv::test
