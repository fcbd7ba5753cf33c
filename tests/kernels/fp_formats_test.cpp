// The deployed floating-point KV formats (kernels/common/quant_formats.h) against an encoder
// written here from the OCP 8-bit FP and MX v1.0 definitions in f64: every code's value, and
// the nearest code (ties to the even mantissa, saturating at the largest finite value) for
// all codes, their midpoints, their neighbours one f32 ulp away and many random floats; the
// rows' bytes (FP8 with its row scale, NVFP4, MXFP4) equal rows encoded here; round trips
// stay within each format's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/common/quant_formats.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

// A sign-magnitude minifloat: e exponent bits, m mantissa bits, bias; the finite magnitudes
// and their codes, ascending (the definition: field 0 subnormal m/2^M * 2^(1-bias), else
// (1 + m/2^M) * 2^(field-bias); E4M3 drops S.1111.111 (NaN), E5M2 drops field 31 (inf/NaN)).
struct Spec {
    int e, m, bias;
    bool e4m3_nan_only;  // E4M3: only the all-ones pattern is special
    std::vector<std::pair<double, int>> finite() const {
        std::vector<std::pair<double, int>> out;
        for (int c = 0; c < (1 << (e + m)); ++c) {
            const int field = c >> m, mant = c & ((1 << m) - 1);
            if (e4m3_nan_only && field == (1 << e) - 1 && mant == (1 << m) - 1) continue;
            if (!e4m3_nan_only && e > 2 && field == (1 << e) - 1) continue;
            const double v = field == 0 ? double(mant) / double(1 << m) * std::pow(2.0, 1 - bias)
                                        : (1.0 + double(mant) / double(1 << m)) * std::pow(2.0, field - bias);
            out.push_back({v, c});
        }
        return out;
    }
    double max() const { return finite().back().first; }
    // Nearest finite magnitude by binary search; a tie takes the even code; beyond the largest
    // value (inf included) the largest code. The sign bit follows x.
    int encode(double x) const {
        const auto t = finite();
        const int sign = std::signbit(x) ? 1 << (e + m) : 0;
        const double a = std::fabs(x);
        if (a >= t.back().first) return sign | t.back().second;
        auto hi = std::lower_bound(t.begin(), t.end(), std::make_pair(a, -1));
        if (hi->first == a) return sign | hi->second;
        auto lo = hi - 1;
        const double dl = a - lo->first, dh = hi->first - a;
        const int c = dl < dh ? lo->second : dh < dl ? hi->second : (lo->second % 2 == 0 ? lo->second : hi->second);
        return sign | c;
    }
    double decode(int c) const {
        const int field = (c >> m) & ((1 << e) - 1), mant = c & ((1 << m) - 1);
        const double s = (c >> (e + m)) & 1 ? -1.0 : 1.0;
        if (e4m3_nan_only && field == (1 << e) - 1 && mant == (1 << m) - 1) return std::numeric_limits<double>::quiet_NaN();
        if (!e4m3_nan_only && e > 2 && field == (1 << e) - 1)
            return mant ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
        return s * (field == 0 ? double(mant) / double(1 << m) * std::pow(2.0, 1 - bias)
                               : (1.0 + double(mant) / double(1 << m)) * std::pow(2.0, field - bias));
    }
};

const Spec kE4M3{4, 3, 7, true}, kE5M2{5, 2, 15, false}, kE2M1{2, 1, 1, false};

// Values to encode: every code's value, the midpoints between neighbours, each one f32 ulp
// either side, both signs, zero, tiny and huge values, then random floats over the range.
std::vector<float> probes(const Spec& s, uint64_t seed) {
    std::vector<float> v = {0.0f, -0.0f, 1e-30f, -1e-30f, std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), 1e30f, -1e30f};
    const auto t = s.finite();
    auto both = [&](float x) {
        for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 1e38f)}) v.push_back(y), v.push_back(-y);
    };
    for (size_t i = 0; i < t.size(); ++i) {
        both(float(t[i].first));
        if (i + 1 < t.size()) both(float(0.5 * (t[i].first + t[i + 1].first)));
    }
    both(float(t.back().first * 1.03));
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> lg(std::log2(t[1].first) - 4, std::log2(t.back().first) + 1);
    for (int i = 0; i < 20000; ++i) v.push_back(float((rng() & 1 ? -1.0 : 1.0) * std::exp2(lg(rng))));
    return v;
}

TEST(FpFormats, E4M3AllCodesAndProbesBitExact) {
    EXPECT_EQ(kE4M3.max(), 448.0);
    for (int c = 0; c < 256; ++c) {
        const double want = kE4M3.decode(c);
        const float got = e4m3_to_f32(uint8_t(c));
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << "code " << c;
            continue;
        }
        EXPECT_EQ(double(got), want) << "code " << c;
        EXPECT_EQ(int(f32_to_e4m3(got)), c) << "code " << c << " does not re-encode to itself";
    }
    for (float x : probes(kE4M3, test::seed_for("e4m3")))
        ASSERT_EQ(int(f32_to_e4m3(x)), kE4M3.encode(x)) << "x = " << x;
    EXPECT_EQ(int(f32_to_e4m3(std::nanf(""))), 0x7f);
}

TEST(FpFormats, E5M2AllCodesAndProbesBitExact) {
    EXPECT_EQ(kE5M2.max(), 57344.0);
    for (int c = 0; c < 256; ++c) {
        const double want = kE5M2.decode(c);
        const float got = e5m2_to_f32(uint8_t(c));
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(got)) << "code " << c;
            continue;
        }
        EXPECT_EQ(double(got), want) << "code " << c;
        if (std::isfinite(want)) {
            EXPECT_EQ(int(f32_to_e5m2(got)), c) << "code " << c;
        }
    }
    for (float x : probes(kE5M2, test::seed_for("e5m2")))
        ASSERT_EQ(int(f32_to_e5m2(x)), kE5M2.encode(x)) << "x = " << x;
    EXPECT_TRUE(std::isnan(e5m2_to_f32(f32_to_e5m2(std::nanf("")))));
}

TEST(FpFormats, E2M1AndE8M0BitExact) {
    const double vals[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};  // the E2M1 magnitudes as listed by OCP MX
    for (int c = 0; c < 16; ++c) EXPECT_EQ(double(e2m1_to_f32(uint8_t(c))), (c & 8 ? -1.0 : 1.0) * vals[c & 7]) << "code " << c;
    for (float x : probes(kE2M1, test::seed_for("e2m1"))) ASSERT_EQ(int(f32_to_e2m1(x)), kE2M1.encode(x)) << "x = " << x;
    for (int c = 0; c < 255; ++c) EXPECT_EQ(double(e8m0_to_f32(uint8_t(c))), std::ldexp(1.0, c - 127)) << "E8M0 code " << c;
    EXPECT_TRUE(std::isnan(e8m0_to_f32(0xff)));
}

// Rows encoded here from the definitions (f32 scale arithmetic as the formats state it).
std::vector<uint8_t> fp8_row(const std::vector<float>& x, const Spec& s) {
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float sc = amax / float(s.max());
    std::vector<uint8_t> out(x.size() + 4);
    for (size_t i = 0; i < x.size(); ++i) out[i] = sc > 0 ? uint8_t(s.encode(x[i] / sc)) : 0;
    std::memcpy(&out[x.size()], &sc, 4);
    return out;
}

std::vector<uint8_t> nvfp4_row(const std::vector<float>& x) {
    const size_t n = x.size();
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float sg = amax / (448.0f * 6.0f);
    std::vector<uint8_t> out(n / 2 + n / 16 + 4, 0);
    for (size_t b = 0; b < n / 16; ++b) {
        float bamax = 0;
        for (size_t i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(x[b * 16 + i]));
        const int sc = sg > 0 ? kE4M3.encode((bamax / 6.0f) / sg) : 0;
        const float d = float(kE4M3.decode(sc)) * sg;
        out[n / 2 + b] = uint8_t(sc);
        for (size_t i = 0; i < 16; ++i) out[(b * 16 + i) / 2] |= uint8_t((d > 0 ? kE2M1.encode(x[b * 16 + i] / d) : 0) << (4 * (i % 2)));
    }
    std::memcpy(&out[n / 2 + n / 16], &sg, 4);
    return out;
}

std::vector<uint8_t> mxfp4_row(const std::vector<float>& x) {
    std::vector<uint8_t> out(x.size() / 32 * 17, 0);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        double amax = 0;
        for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b * 32 + i])));
        int e = -127;
        if (amax > 0) {
            int ex;
            std::frexp(amax, &ex);  // amax = f 2^ex, f in [0.5, 1): floor(log2 amax) = ex - 1
            e = std::clamp(ex - 1 - 2, -127, 127);
        }
        out[b * 17] = uint8_t(e + 127);
        const float X = float(std::ldexp(1.0, e));
        for (size_t i = 0; i < 32; ++i) out[b * 17 + 1 + i % 16] |= uint8_t(kE2M1.encode(x[b * 32 + i] / X) << (i < 16 ? 0 : 4));
    }
    return out;
}

std::vector<float> random_row(std::mt19937_64& rng, size_t n, int kind) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> lg(-30.0f, 12.0f);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
        x[i] = kind == 0 ? nd(rng) : kind == 1 ? nd(rng) * std::exp2(lg(rng)) : 0.0f;  // normal, wide dynamic range, all zero
        if (kind == 1 && i % 7 == 0) x[i] = -x[i] * 1000.0f;
    }
    return x;
}

TEST(FpFormats, RowsEqualRowsEncodedFromTheDefinitions) {
    std::mt19937_64 rng(test::seed_for("fp rows"));
    for (int trial = 0; trial < 300; ++trial) {
        const size_t n = size_t(32 * (1 + trial % 4));
        const std::vector<float> x = random_row(rng, n, trial % 10 == 9 ? 2 : trial % 3 == 0 ? 1 : 0);
        const std::pair<QuantFormat, std::vector<uint8_t>> cases[] = {{QuantFormat::FP8_E4M3, fp8_row(x, kE4M3)},
                                                                      {QuantFormat::FP8_E5M2, fp8_row(x, kE5M2)},
                                                                      {QuantFormat::NVFP4, nvfp4_row(x)},
                                                                      {QuantFormat::MXFP4, mxfp4_row(x)}};
        for (const auto& [f, want] : cases) {
            ASSERT_EQ(quant_row_bytes(f, int64_t(n)), int64_t(want.size())) << int(f);
            std::vector<uint8_t> got(want.size());
            quantize_row(f, x.data(), int64_t(n), got.data());
            ASSERT_EQ(got, want) << "format " << int(f) << " trial " << trial;
        }
    }
}

TEST(FpFormats, RowBytesAsDefined) {
    EXPECT_EQ(quant_row_bytes(QuantFormat::FP8_E4M3, 64), 64 + 4);
    EXPECT_EQ(quant_row_bytes(QuantFormat::FP8_E5M2, 24), 24 + 4);
    EXPECT_EQ(quant_row_bytes(QuantFormat::NVFP4, 64), 32 + 4 + 4);
    EXPECT_EQ(quant_row_bytes(QuantFormat::MXFP4, 64), 2 * 17);
    EXPECT_FALSE(quant_row_ok(QuantFormat::NVFP4, 24));
    EXPECT_FALSE(quant_row_ok(QuantFormat::MXFP4, 48));
    EXPECT_TRUE(quant_row_ok(QuantFormat::FP8_E4M3, 7));
}

// Bounds in f64: FP8 half a code step, relative 2^-(M+1) for normals and absolute
// 2^(1-bias-M-1) s below (s the row scale); NVFP4 half the E2M1 step (at most the block scale
// d, at 4..6) or the clipping of a block whose E4M3 scale rounded down (<= bamax / 17);
// MXFP4 at most 2 X (elements of up to 8 X clip to 6 X).
TEST(FpFormats, RoundTripsWithinTheirBounds) {
    std::mt19937_64 rng(test::seed_for("fp bounds"));
    for (int trial = 0; trial < 300; ++trial) {
        const size_t n = 64;
        const std::vector<float> x = random_row(rng, n, trial % 2);
        double amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(double(v)));
        std::vector<uint8_t> q(size_t(quant_row_bytes(QuantFormat::NVFP4, int64_t(n)) + 200));
        std::vector<float> y(n);
        for (auto [f, spec] : {std::pair{QuantFormat::FP8_E4M3, kE4M3}, std::pair{QuantFormat::FP8_E5M2, kE5M2}}) {
            quantize_row(f, x.data(), int64_t(n), q.data());
            dequantize_row(f, q.data(), int64_t(n), y.data());
            const double s = amax / spec.max();
            for (size_t i = 0; i < n; ++i) {
                const double bound = std::max(std::fabs(double(x[i])) * std::ldexp(1.0, -spec.m - 1), s * std::ldexp(1.0, -spec.bias - spec.m)) * (1 + 1e-6) +
                                     amax * 1e-12;
                ASSERT_LE(std::fabs(double(y[i]) - double(x[i])), bound) << int(f) << " element " << i << " x " << x[i];
            }
        }
        quantize_row(QuantFormat::NVFP4, x.data(), int64_t(n), q.data());
        dequantize_row(QuantFormat::NVFP4, q.data(), int64_t(n), y.data());
        for (size_t b = 0; b < n / 16; ++b) {
            double bamax = 0;
            for (size_t i = 0; i < 16; ++i) bamax = std::max(bamax, std::fabs(double(x[b * 16 + i])));
            // d within half an E4M3 step of bamax / 6 (relative 1/16, or absolute 2^-10 sg when subnormal)
            const double dmax = bamax / 6.0 * (1.0 + 1.0 / 16.0) + std::ldexp(amax / 2688.0, -10);
            for (size_t i = 0; i < 16; ++i)
                ASSERT_LE(std::fabs(double(y[b * 16 + i]) - double(x[b * 16 + i])), std::max(dmax, bamax / 17.0 + 6.0 * std::ldexp(amax / 2688.0, -10)) * (1 + 1e-6) + 1e-30)
                    << "nvfp4 block " << b << " element " << i;
        }
        quantize_row(QuantFormat::MXFP4, x.data(), int64_t(n), q.data());
        dequantize_row(QuantFormat::MXFP4, q.data(), int64_t(n), y.data());
        for (size_t b = 0; b < n / 32; ++b) {
            double bamax = 0;
            for (size_t i = 0; i < 32; ++i) bamax = std::max(bamax, std::fabs(double(x[b * 32 + i])));
            int ex = 0;
            std::frexp(bamax, &ex);
            const double X = bamax > 0 ? std::ldexp(1.0, std::max(ex - 3, -127)) : 0.0;
            for (size_t i = 0; i < 32; ++i)
                ASSERT_LE(std::fabs(double(y[b * 32 + i]) - double(x[b * 32 + i])), 2.0 * X + 1e-38) << "mxfp4 block " << b << " element " << i;
        }
    }
}

}  // namespace
}  // namespace kv
