// leverage against kvpress' LeverageScorePress in f64: per (b, g) row, the cached keys centred
// over the sequence, sketched on the right by the documented Gaussian Phi (docs/POLICIES.md
// #leverage: Box-Muller over splitmix64 of (layer, head, index), / sqrt(k)), leverage
// y^T (Y^T Y + 0.01 I)^-1 y by an explicit Gauss-Jordan inverse, clamped at 0, z-normalised
// over the layer (unbiased std). The harness feeds unrotated keys (no RoPE frequencies).
#include "policy_reference_util.h"

namespace kv::test {
namespace {

uint64_t splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

std::vector<double> inverse(std::vector<double> A, int64_t n) {
    std::vector<double> I((size_t)(n * n), 0.0);
    for (int64_t i = 0; i < n; ++i) I[size_t(i * n + i)] = 1;
    for (int64_t c = 0; c < n; ++c) {
        int64_t p = c;
        for (int64_t r = c + 1; r < n; ++r)
            if (std::fabs(A[size_t(r * n + c)]) > std::fabs(A[size_t(p * n + c)])) p = r;
        for (int64_t k = 0; k < n; ++k) std::swap(A[size_t(c * n + k)], A[size_t(p * n + k)]), std::swap(I[size_t(c * n + k)], I[size_t(p * n + k)]);
        const double d = A[size_t(c * n + c)];
        for (int64_t k = 0; k < n; ++k) A[size_t(c * n + k)] /= d, I[size_t(c * n + k)] /= d;
        for (int64_t r = 0; r < n; ++r)
            if (r != c) {
                const double f = A[size_t(r * n + c)];
                for (int64_t k = 0; k < n; ++k) A[size_t(r * n + k)] -= f * A[size_t(c * n + k)], I[size_t(r * n + k)] -= f * I[size_t(c * n + k)];
            }
    }
    return I;
}

std::vector<double> leverage_reference(const LayerHarness& h, int64_t k) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, D = h.D, K = k > 0 ? k : D;
    std::vector<double> lev((size_t)(h.B * h.G * L), 0.0), all;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        const int64_t g = r % h.G;
        std::vector<double> mean((size_t)D, 0.0);
        for (int64_t j = 0; j < T; ++j)
            for (int64_t d = 0; d < D; ++d) mean[size_t(d)] += double(slot_key(h, r, j)[size_t(d)]) / double(T);
        std::vector<double> Y((size_t)(T * K), 0.0);
        for (int64_t j = 0; j < T; ++j)
            for (int64_t c = 0; c < K; ++c)
                for (int64_t d = 0; d < D; ++d) {
                    const double x = double(slot_key(h, r, j)[size_t(d)]) - mean[size_t(d)];
                    if (k == 0) {
                        if (d == c) Y[size_t(j * K + c)] = x;
                        continue;
                    }
                    const uint64_t e = uint64_t(d * K + c), hh = splitmix(splitmix(splitmix(0) ^ uint64_t(g)) ^ e), h2 = splitmix(hh);
                    const double u1 = double((hh >> 11) + 1) / 9007199254740992.0, u2 = double(h2 >> 11) / 9007199254740992.0;
                    Y[size_t(j * K + c)] += x * std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2) / std::sqrt(double(k));
                }
        std::vector<double> G((size_t)(K * K), 0.0);
        for (int64_t a = 0; a < K; ++a)
            for (int64_t b = 0; b < K; ++b) {
                for (int64_t j = 0; j < T; ++j) G[size_t(a * K + b)] += Y[size_t(j * K + a)] * Y[size_t(j * K + b)];
                if (a == b) G[size_t(a * K + b)] += 1e-2;
            }
        const std::vector<double> Gi = inverse(G, K);
        for (int64_t j = 0; j < T; ++j) {
            double l = 0;
            for (int64_t a = 0; a < K; ++a)
                for (int64_t b = 0; b < K; ++b) l += Y[size_t(j * K + a)] * Gi[size_t(a * K + b)] * Y[size_t(j * K + b)];
            all.push_back(lev[size_t(r * L + j)] = std::max(l, 0.0));
        }
    }
    double mu = 0, var = 0;
    for (double x : all) mu += x / double(all.size());
    for (double x : all) var += (x - mu) * (x - mu);
    const double sd = std::max(std::sqrt(var / double(all.size() - 1)), 1e-6);
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j) lev[size_t(r * L + j)] = (lev[size_t(r * L + j)] - mu) / sd;
    return lev;
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
