// bf16/f16 conversions against independent references: the nearest representable value found
// by exhaustive/candidate search in f64 (ties to even), not by the bit tricks under test.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kernels/common/dtype.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

// Decode f16 bits independently with ldexp.
double f16_decode(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = std::ldexp(double(m), -24);
    else if (e == 31) v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
    else v = std::ldexp(double(1024 + m), e - 25);
    return s ? -v : v;
}

TEST(DType, F16DecodeMatchesLdexpForAllBitPatterns) {
    for (uint32_t h = 0; h < 65536; ++h) {
        double want = f16_decode(uint16_t(h));
        float got = f16_to_f32(uint16_t(h));
        if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << h;
        else EXPECT_EQ(double(got), want) << "bits " << h;
    }
}

TEST(DType, F16EncodeIsNearestEven) {
    // All finite positive f16 values, sorted, as the candidate set.
    std::vector<double> vals;
    for (uint32_t h = 0; h < 0x7c00; ++h) vals.push_back(f16_decode(uint16_t(h)));
    std::mt19937_64 rng(test::seed_for("f16 encode"));
    std::uniform_real_distribution<double> ex(-26, 17);
    for (int i = 0; i < 200000; ++i) {
        float x = float(std::ldexp(std::uniform_real_distribution<double>(1, 2)(rng), int(ex(rng))));
        if (i % 7 == 0) x = -x;
        double a = std::fabs(double(x));
        uint16_t got = f32_to_f16(x);
        double g = f16_decode(got);
        if (a >= 65520.0) {  // beyond max + half ulp: inf
            EXPECT_TRUE(std::isinf(g)) << x;
            continue;
        }
        auto it = std::lower_bound(vals.begin(), vals.end(), a);
        size_t hi = size_t(it - vals.begin()), lo = hi ? hi - 1 : 0;
        if (hi >= vals.size()) hi = vals.size() - 1;
        double dl = a - vals[lo], dh = vals[hi] - a;
        size_t pick = dl < dh ? lo : (dh < dl ? hi : ((lo & 1) == 0 ? lo : hi));  // ties: even mantissa
        EXPECT_EQ(std::fabs(g), vals[pick]) << "x=" << x;
        EXPECT_EQ(std::signbit(g), std::signbit(x));
    }
    EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(std::numeric_limits<float>::infinity()))));
}

TEST(DType, Bf16EncodeIsNearestEven) {
    std::mt19937_64 rng(test::seed_for("bf16 encode"));
    std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
    for (int i = 0; i < 200000; ++i) {
        uint32_t u = bits(rng);
        float x = bits_f32(u);
        if (!std::isfinite(x)) continue;
        uint16_t got = f32_to_bf16(x);
        // Candidates: truncation and the next bf16 away from zero.
        uint16_t t = uint16_t(u >> 16), t1 = uint16_t(t + 1);
        double a = double(x), ct = double(bf16_to_f32(t)), c1 = double(bf16_to_f32(t1));
        // Past the largest finite bf16 the next "value" is 2^128 for rounding purposes (IEEE).
        if (std::isinf(c1)) c1 = std::copysign(std::ldexp(1.0, 128), a);
        double dt = std::fabs(a - ct), d1 = std::fabs(c1 - a);
        uint16_t want = dt < d1 ? t : (d1 < dt ? t1 : ((t & 1) == 0 ? t : t1));
        ASSERT_EQ(got, want) << "x=" << x << " bits=" << u;
    }
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

}  // namespace
}  // namespace kv
