// compactor against kvpress' CompactorPress in f64: over the cached tokens outside the
// protected ends (positions < sinks_start, and the sinks_end newest), b * z(leverage) +
// z(pool3(tile attention x |v|)), both z-normalised over the layer; the protected tokens take
// the maximum + 1. b: the option, or 1 - T / P when it is negative.
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> compactor_reference(const LayerHarness& h, int64_t C, int64_t k, double blending, int64_t first, int64_t last) {
    const int64_t Pa = h.P, T = h.cache->layer(0).policy().current_length();
    const int64_t left = std::min(first, Pa), right = std::min(last, std::max<int64_t>(0, Pa - left));
    const std::vector<double> a = ref_tile_attention(h, C);
    std::vector<double> att, lev;
    std::vector<std::vector<int64_t>> slots;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        slots.push_back(ref_slots_by_position(h, r, [&](int32_t p) { return p >= left && p < Pa - right; }));
        for (double x : ref_pool3(a, h.L, r, slots.back())) att.push_back(x);
        for (double x : ref_leverage(h, r, slots.back(), k)) lev.push_back(x);
    }
    ref_z_normalise(att);
    ref_z_normalise(lev);
    const double b = blending >= 0 ? blending : std::max(0.0, 1.0 - double(T) / double(Pa));
    double top = -INFINITY;
    for (size_t i = 0; i < att.size(); ++i) top = std::max(top, att[i] += b * lev[i]);
    if (att.empty()) top = 0;  // nothing scored: every token is protected alike
    std::vector<double> out((size_t)(h.B * h.G * h.L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) out[size_t(r * h.L + j)] = top + 1;
    size_t i = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : slots[size_t(r)]) out[size_t(r * h.L + j)] = att[i++];
    return out;
}

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
