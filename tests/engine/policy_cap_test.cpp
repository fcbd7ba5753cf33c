// cap against CAPKV's definition in f64 (kvpress' CapPress): per query head the anchor mu' (mean
// pre-RoPE query moved by the mean future rotation), weights w = exp(tau cos(k, mu') - max),
// capacity A = I + sum (w + eps) v v^T by an explicit inverse, score w v^T A^-1 v averaged over
// the group; sinks take the layer's maximum + 1.
#include "policy_references.h"

namespace kv::test {
namespace {

std::vector<double> rope_theta(int64_t D) {
    std::vector<double> theta(size_t(D / 2));
    for (int64_t i = 0; i < D / 2; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * double(i) / double(D));
    return theta;
}

TEST(Cap, ScoresAndChoicesEqualTheF64Reference) {
    // D = 16 fully rotated, 6 future positions, 2 sinks, tau 5 (kvpress' default), eps 1e-6
    const std::vector<double> theta = rope_theta(16);
    check_policy_against_reference(
        "cap-default", [](KVCacheConfig& c) { c.policy_options = {{"cap_n_future_positions", 6}, {"cap_n_sink", 2}}; },
        [&](const LayerHarness& h, int64_t, int64_t) { return cap_reference(h, theta, 5.0, 6, 2, 1e-6); }, {4, 3, 4, 2, 4, 1, 5, 1}, 2e-6,
        [&theta](LayerHarness& h) { h.cache->set_rope_frequencies(&theta); });
}

TEST(Cap, WithoutSinksAndASharpTemperatureEqualsTheF64Reference) {
    const std::vector<double> theta = rope_theta(16);
    check_policy_against_reference(
        "cap-default", [](KVCacheConfig& c) { c.policy_options = {{"cap_n_sink", 0}, {"cap_tau", 20}, {"cap_epsilon", 0.01}}; },
        [&](const LayerHarness& h, int64_t, int64_t) { return cap_reference(h, theta, 20.0, 512, 0, 0.01); }, {4, 3, 4, 2, 4, 1, 5, 1}, 2e-6,
        [&theta](LayerHarness& h) { h.cache->set_rope_frequencies(&theta); });
}

// Head size 64 and 24 slots: four 16-row blocks of A's upper triangle and of L^-1's lower one,
// and 22 non-sink slots padded to 32 columns in the transposed products.
TEST(Cap, HeadSize64AndPaddedSlotCountsEqualTheF64Reference) {
    constexpr int64_t L = 24, D = 64;
    const std::vector<double> theta = rope_theta(D);
    LayerHarness h("cap-default", L, seed_for("cap head size 64"), 0, D);
    h.cfg.policy_options = {{"cap_n_future_positions", 9}, {"cap_n_sink", 2}};
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_rope_frequencies(&theta);
    h.step(L);
    for (int64_t n : {5, 3, 7, 1}) {
        h.step(n);
        const std::vector<double> ref = cap_reference(h, theta, 5.0, 9, 2, 1e-6);
        const std::vector<float> got = h.layer().policy().slot_scores();
        ASSERT_EQ(got.size(), ref.size());
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], ref[i], 2e-6 * std::max(1.0, std::fabs(ref[i]))) << "slot " << i << " at " << h.P;
    }
}

}  // namespace
}  // namespace kv::test
