// nearest_by_cosine (engine/kv/policies/nearest_key.h), merging-*'s target search, against the
// definition computed naively in double over every pair: the same index (ties to the lower)
// and the same cosine to the bit, on keys built to sit within f32 rounding of each other
// (near-duplicates, exact duplicates, scaled copies), zero keys, and keys too small or too large
// for the f32 screen.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/kv/policies/nearest_key.h"

namespace kv::test {
namespace {

struct Naive {
    int32_t index = -1;
    double cos = -2;
};

Naive naive_nearest(const float* e, const std::vector<float>& K, int64_t nk, int64_t D) {
    double ne = 0;
    for (int64_t d = 0; d < D; ++d) ne += double(e[d]) * double(e[d]);
    ne = std::sqrt(ne);
    Naive out;
    for (int64_t i = 0; i < nk; ++i) {
        double dot = 0, nn = 0;
        for (int64_t d = 0; d < D; ++d) dot += double(e[d]) * double(K[size_t(i * D + d)]), nn += double(K[size_t(i * D + d)]) * K[size_t(i * D + d)];
        nn = std::sqrt(nn);
        const double c = ne > 0 && nn > 0 ? dot / (ne * nn) : 0.0;
        if (c > out.cos) out.cos = c, out.index = int32_t(i);
    }
    return out;
}

// The index an f32-only search would pick (products and sums in float): where it differs from
// the exact one, the screen had to fall back to double.
int32_t f32_nearest(const float* e, const std::vector<float>& K, int64_t nk, int64_t D) {
    float ne = 0, best = -2;
    for (int64_t d = 0; d < D; ++d) ne += e[d] * e[d];
    int32_t bi = -1;
    for (int64_t i = 0; i < nk; ++i) {
        float dot = 0, nn = 0;
        for (int64_t d = 0; d < D; ++d) dot += e[d] * K[size_t(i * D + d)], nn += K[size_t(i * D + d)] * K[size_t(i * D + d)];
        const float c = dot / std::sqrt(ne * nn);
        if (c > best) best = c, bi = int32_t(i);
    }
    return bi;
}

void check(int64_t ne, int64_t nk, int64_t D, const std::vector<float>& E, const std::vector<float>& K, int* f32_differs) {
    std::vector<int32_t> best(static_cast<size_t>(ne));
    std::vector<double> cos(static_cast<size_t>(ne));
    // The keys as one table, kept rows first (in reverse, so the indices are not the rows), then
    // the evicted ones.
    std::vector<float> keys;
    for (int64_t i = nk; i-- > 0;) keys.insert(keys.end(), K.begin() + i * D, K.begin() + (i + 1) * D);
    keys.insert(keys.end(), E.begin(), E.end());
    std::vector<int32_t> kept(static_cast<size_t>(nk)), evicted(static_cast<size_t>(ne));
    for (int64_t i = 0; i < nk; ++i) kept[size_t(i)] = int32_t(nk - 1 - i);
    for (int64_t j = 0; j < ne; ++j) evicted[size_t(j)] = int32_t(nk + j);
    NearestKeyScratch s;
    nearest_by_cosine(keys.data(), D, evicted.data(), ne, kept.data(), nk, best.data(), cos.data(), s);
    for (int64_t j = 0; j < ne; ++j) {
        const Naive want = naive_nearest(E.data() + j * D, K, nk, D);
        ASSERT_EQ(best[size_t(j)], want.index) << "evicted key " << j << " of " << ne << ", D " << D;
        ASSERT_EQ(cos[size_t(j)], want.cos) << "evicted key " << j;
        if (f32_differs && f32_nearest(E.data() + j * D, K, nk, D) != want.index) ++*f32_differs;
    }
}

TEST(NearestKey, NearDuplicateKeysGetTheExactSearchsChoice) {
    // Each evicted key faces kept keys that are copies of one base key with a few components
    // moved by an ulp: cosines a few 1e-8 apart, inside f32's rounding of a D-term product.
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 1 << 20);
    int f32_differs = 0;
    for (int64_t D : {64, 128, 17}) {
        const int64_t ne = 40, nk = 96;
        std::vector<float> E(size_t(ne * D)), K(size_t(nk * D));
        std::vector<float> base(static_cast<size_t>(D));
        for (float& x : base) x = g(rng);
        for (int64_t i = 0; i < nk; ++i)
            for (int64_t d = 0; d < D; ++d) {
                float v = base[size_t(d)];
                for (int step = pick(rng) % 3; step > 0; --step) v = std::nextafter(v, pick(rng) % 2 ? 10.0f : -10.0f);
                K[size_t(i * D + d)] = v;
            }
        for (int64_t i = 8; i < 12; ++i)  // exact duplicates of an earlier key: a tie, the lower index wins
            for (int64_t d = 0; d < D; ++d) K[size_t(i * D + d)] = K[size_t(3 * D + d)];
        for (int64_t j = 0; j < ne; ++j)
            for (int64_t d = 0; d < D; ++d) E[size_t(j * D + d)] = base[size_t(d)] + 1e-3f * g(rng);
        check(ne, nk, D, E, K, &f32_differs);
        if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(f32_differs, 0) << "the keys should be close enough that an f32 search alone picks differently";
}

TEST(NearestKey, RandomKeysZeroKeysAndScaledCopies) {
    std::mt19937 rng(11);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t D = 64, ne = 33, nk = 130;
    std::vector<float> E(size_t(ne * D)), K(size_t(nk * D));
    for (float& x : E) x = g(rng);
    for (float& x : K) x = g(rng);
    for (int64_t d = 0; d < D; ++d) {
        K[size_t(5 * D + d)] = 0.0f;                            // a zero kept key: cosine 0
        K[size_t(9 * D + d)] = 4.0f * K[size_t(2 * D + d)];     // a scaled copy: the same cosine, lower index wins
        E[size_t(4 * D + d)] = 0.0f;                            // a zero evicted key: every cosine 0, index 0
        E[size_t(6 * D + d)] = K[size_t(9 * D + d)] * 0.5f;     // parallel to 2 and 9
        K[size_t(20 * D + d)] = K[size_t(21 * D + d)] * 1e-12f;  // too small for the screen
        K[size_t(30 * D + d)] = K[size_t(31 * D + d)] * 1e12f;   // too large for it
        E[size_t(7 * D + d)] = K[size_t(40 * D + d)] * 1e-12f;
    }
    check(ne, nk, D, E, K, nullptr);
}

TEST(NearestKey, AllKeptKeysZeroPicksTheFirst) {
    const int64_t D = 8, ne = 2, nk = 3;
    std::vector<float> E(size_t(ne * D), 1.0f), K(size_t(nk * D), 0.0f);
    check(ne, nk, D, E, K, nullptr);
}

TEST(NearestKey, AZeroKeptKeyBeatsNegativeCosines) {
    // Every nonzero kept key points away from the evicted key: the zero key's cosine 0 is the best.
    const int64_t D = 16, ne = 1, nk = 5;
    std::vector<float> E(size_t(ne * D)), K(size_t(nk * D));
    for (int64_t d = 0; d < D; ++d) {
        E[size_t(d)] = float(d + 1);
        for (int64_t i = 0; i < nk; ++i) K[size_t(i * D + d)] = i == 3 ? 0.0f : -float(d + 1 + i);
    }
    check(ne, nk, D, E, K, nullptr);
}

TEST(NearestKey, AKeyOutsideTheScreenDoesNotHideTheBest) {
    // A tiny kept key (outside the f32 screen's range) pointing away, every other key pointing
    // away too: the best cosine is negative and must still be found.
    const int64_t D = 16, ne = 1, nk = 4;
    std::vector<float> E(size_t(ne * D)), K(size_t(nk * D));
    for (int64_t d = 0; d < D; ++d) {
        E[size_t(d)] = float(d + 1);
        for (int64_t i = 0; i < nk; ++i) K[size_t(i * D + d)] = -float(d + 1) * (i == 0 ? 1e-14f : 1.0f) + (i == 2 && d == 0 ? 5.0f : 0.0f);
    }
    check(ne, nk, D, E, K, nullptr);
}

}  // namespace
}  // namespace kv::test
