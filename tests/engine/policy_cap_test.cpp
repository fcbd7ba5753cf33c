// cap against CAPKV's definition in f64 (kvpress' CapPress): per query head the anchor mu' (mean
// pre-RoPE query moved by the mean future rotation), weights w = exp(tau cos(k, mu') - max),
// capacity A = I + sum (w + eps) v v^T by an explicit inverse, score w v^T A^-1 v averaged over
// the group; sinks take the layer's maximum + 1.
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> cap_reference(const LayerHarness& h, const std::vector<double>& theta, double tau, int64_t F, int64_t sink, double eps) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, D = h.D, R = h.NH / h.G;
    const auto& pos = pol.token_positions();
    const auto qs = prerope_queries(h, theta, sink);
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const int64_t b = r / h.G, g = r % h.G;
        std::vector<int64_t> js;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= sink) js.push_back(j);
        std::vector<double> acc(js.size(), 0.0);
        for (int64_t hh = g * R; hh < (g + 1) * R; ++hh) {
            const std::vector<double> mu = future_query_moments(qs[size_t(b * h.NH + hh)], theta, h.P, F, D).mean;
            double mn = 0;
            for (double x : mu) mn += x * x;
            std::vector<double> w;
            for (int64_t j : js) {
                const auto& k = slot_key(h, r, j);
                double dot = 0, kn = 0;
                for (int64_t d = 0; d < D; ++d) dot += double(k[size_t(d)]) * mu[size_t(d)], kn += double(k[size_t(d)]) * double(k[size_t(d)]);
                w.push_back(tau * std::clamp(dot / std::sqrt(mn * kn), -1.0, 1.0));
            }
            const double m = *std::max_element(w.begin(), w.end());
            for (double& x : w) x = std::exp(x - m);
            std::vector<double> A((size_t)(D * D), 0.0);
            for (int64_t d = 0; d < D; ++d) A[size_t(d * D + d)] = 1;
            for (size_t i = 0; i < js.size(); ++i) {
                const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + js[i])]).second;
                for (int64_t d = 0; d < D; ++d)
                    for (int64_t e = 0; e < D; ++e) A[size_t(d * D + e)] += (w[i] + eps) * double(v[size_t(d)]) * double(v[size_t(e)]);
            }
            const std::vector<double> Ai = inverse(A, D);
            for (size_t i = 0; i < js.size(); ++i) {
                const auto& v = h.history[size_t(r)].at(pos[size_t(r * L + js[i])]).second;
                double l = 0;
                for (int64_t d = 0; d < D; ++d)
                    for (int64_t e = 0; e < D; ++e) l += double(v[size_t(d)]) * Ai[size_t(d * D + e)] * double(v[size_t(e)]);
                acc[i] += w[i] * l / double(R);
            }
        }
        for (size_t i = 0; i < js.size(); ++i) top = std::max(top, out[size_t(r * L + js[i])] = acc[i]);
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < sink) out[size_t(r * L + j)] = top + 1;
    return out;
}

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
