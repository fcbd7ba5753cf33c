// keydiff against KeyDiff's definition in f64 (kvpress' KeyDiffPress): anchor = mean of the
// row's unit keys, score = -cos(key, anchor), over the keys the cache holds after each chunk.
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> keydiff_reference(const LayerHarness& h) {
    const int64_t T = h.cache->layer(0).policy().current_length(), L = h.L, D = h.D;
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<double> a((size_t)D, 0.0);
        for (int64_t j = 0; j < T; ++j) {
            const auto& k = slot_key(h, r, j);
            double nn = 0;
            for (float x : k) nn += double(x) * double(x);
            for (int64_t d = 0; d < D; ++d) a[size_t(d)] += double(k[size_t(d)]) / std::sqrt(nn) / double(T);
        }
        for (int64_t j = 0; j < T; ++j) {
            const auto& k = slot_key(h, r, j);
            double dot = 0, kk = 0, aa = 0;
            for (int64_t d = 0; d < D; ++d) dot += double(k[size_t(d)]) * a[size_t(d)], kk += double(k[size_t(d)]) * double(k[size_t(d)]),
                                         aa += a[size_t(d)] * a[size_t(d)];
            out[size_t(r * L + j)] = -dot / std::sqrt(kk * aa);
        }
    }
    return out;
}

TEST(KeyDiff, ScoresAndChoicesEqualTheF64Reference) {
    check_policy_against_reference("keydiff-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return keydiff_reference(h); });
}

}  // namespace
}  // namespace kv::test
