// non-causal-attn against kvpress' NonCausalAttnPress in f64: tiles of C positions; inside a
// tile every query attends to every key of the tile (unscaled dot products, softmax over the
// tile's keys), summed over the tile's queries and averaged over the group's heads; times the
// value norm; average-pooled over 3 neighbours in position order (zero padding counted);
// z-normalised over every cached token of the layer (torch's unbiased std).
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> nca_reference(const LayerHarness& h, int64_t C) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, D = h.D, Pa = h.P;
    const auto& pos = pol.token_positions();
    // every query ever fed, by (b, head, position)
    auto query = [&](int64_t b, int64_t hh, int64_t p) {
        for (const auto& [P0, q] : h.all_q)
            if (p >= P0 && p < P0 + q.size(2)) {
                const std::vector<double> qv = q.to_f64_vector();
                const int64_t n = q.size(2);
                return std::vector<double>(qv.begin() + ((b * h.NH + hh) * n + (p - P0)) * D, qv.begin() + ((b * h.NH + hh) * n + (p - P0) + 1) * D);
            }
        ADD_FAILURE() << "no query at position " << p;
        return std::vector<double>((size_t)D, 0.0);
    };
    std::vector<double> a((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const int64_t b = r / h.G, g = r % h.G;
        for (int64_t j = 0; j < T; ++j) {
            const int64_t p = pos[size_t(r * L + j)], t0 = p / C * C, t1 = std::min(t0 + C, Pa);
            double A = 0;
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                for (int64_t i = t0; i < t1; ++i) {
                    const std::vector<double> q = query(b, hh, i);
                    std::vector<double> s;
                    for (int64_t kp = t0; kp < t1; ++kp) {
                        const auto& k = h.history[size_t(r)].at(kp).first;
                        double d = 0;
                        for (int64_t x = 0; x < D; ++x) d += q[size_t(x)] * double(k[size_t(x)]);
                        s.push_back(d);
                    }
                    const double m = *std::max_element(s.begin(), s.end());
                    double z = 0;
                    for (double x : s) z += std::exp(x - m);
                    A += std::exp(s[size_t(p - t0)] - m) / z / double(R);
                }
            const auto& v = h.history[size_t(r)].at(p).second;
            double vn = 0;
            for (float x : v) vn += double(x) * double(x);
            a[size_t(r * L + j)] = A * std::sqrt(vn);
        }
    }
    std::vector<double> s((size_t)(h.B * h.G * L), 0.0);
    double sum = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<std::pair<int32_t, int64_t>> order;
        for (int64_t j = 0; j < T; ++j) order.push_back({pos[size_t(r * L + j)], j});
        std::sort(order.begin(), order.end());
        for (int64_t i = 0; i < T; ++i) {
            double acc = 0;
            for (int64_t o = i - 1; o <= i + 1; ++o)
                if (o >= 0 && o < T) acc += a[size_t(r * L + order[size_t(o)].second)];
            sum += s[size_t(r * L + order[size_t(i)].second)] = acc / 3;
        }
    }
    const double N = double(h.B * h.G * T), mean = sum / N;
    double var = 0;
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) var += (s[size_t(r * L + j)] - mean) * (s[size_t(r * L + j)] - mean);
    const double sd = std::max(std::sqrt(var / (N - 1)), 1e-6);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) s[size_t(r * L + j)] = (s[size_t(r * L + j)] - mean) / sd;
    return s;
}

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
