// Properties of the KV quantization formats: the NF4 example of seed 002 reproduces its packed
// bytes; integer-grid data round-trips exactly through Q8/Q4; every format stays within its
// error bound; Q8_0/Q4_0 blocks have llama.cpp's byte layout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "engine/core/error.h"
#include "engine/ops/ops.h"
#include "kernels/common/quant_formats.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

TEST(QuantFormats, Nf4SeedExampleBytes) {
    // shared/seeds/002: a 5x4 weight, one block (bitsandbytes treats 20 values as one block).
    const float w[20] = {0.4767f,  -0.2921f, 0.0787f,  -0.1018f, -0.3453f, 0.3834f,  -0.0107f,
                         -0.4692f, -0.4072f, -0.2996f, -0.4942f, -0.2640f, 0.0125f,  0.2962f,
                         0.3123f,  -0.4705f, -0.1982f, -0.1545f, 0.3358f,  -0.4086f};
    uint8_t out[10 + 4];
    quantize_block_nf4(w, 20, out);
    const uint8_t expected[10] = {242, 149, 30, 112, 18, 2, 125, 208, 52, 225};
    for (int i = 0; i < 10; ++i) EXPECT_EQ(int(out[i]), int(expected[i])) << "byte " << i;
    EXPECT_FLOAT_EQ(get_f32(out + 10), 0.4942f);  // absmax
    // The 4-bit codes listed in the seed: [15, 2, 9, 5, 1, 14, 7, 0, 1, 2, 0, 2, 7, 13, 13, 0, 3, 4, 14, 1]
    const int codes[20] = {15, 2, 9, 5, 1, 14, 7, 0, 1, 2, 0, 2, 7, 13, 13, 0, 3, 4, 14, 1};
    for (int i = 0; i < 20; ++i) EXPECT_EQ(i % 2 == 0 ? out[i / 2] >> 4 : out[i / 2] & 15, codes[i]) << "element " << i;
}

TEST(QuantFormats, IntegerGridRoundTripsExactly) {
    std::mt19937_64 rng(test::seed_for("integer grid"));
    for (int bits : {8, 4}) {
        const int qmax = (1 << bits) - 1;
        for (int trial = 0; trial < 200; ++trial) {
            // x = (k + a) * s with k in [0, qmax] (both ends present), s a power of two.
            const int n = 2 * (8 + int(rng() % 60));
            const float s = std::ldexp(1.0f, int(rng() % 12) - 8);
            const int a = int(rng() % 41) - 20;
            std::vector<float> x((size_t)n);
            for (int i = 0; i < n; ++i) x[size_t(i)] = float(int(rng() % uint64_t(qmax + 1)) + a) * s;
            const size_t i_min = rng() % size_t(n), i_max = (i_min + 1 + rng() % size_t(n - 1)) % size_t(n);
            x[i_min] = float(a) * s;  // both ends of the grid present, at distinct places
            x[i_max] = float(qmax + a) * s;
            std::vector<uint8_t> q((size_t)quant_row_bytes(bits == 8 ? QuantFormat::Q8 : QuantFormat::Q4, n));
            std::vector<float> y((size_t)n);
            QuantFormat f = bits == 8 ? QuantFormat::Q8 : QuantFormat::Q4;
            quantize_row(f, x.data(), n, q.data());
            dequantize_row(f, q.data(), n, y.data());
            // Distinct min and max are guaranteed unless they coincide (then scale = FLT_EPSILON).
            for (int i = 0; i < n; ++i) ASSERT_EQ(y[size_t(i)], x[size_t(i)]) << "bits " << bits << " trial " << trial << " i " << i;
        }
    }
}

TEST(QuantFormats, ErrorBoundsPerFormat) {
    std::mt19937_64 rng(test::seed_for("error bounds"));
    std::normal_distribution<float> nd(0.0f, 1.5f);
    for (int f = 0; f < int(QuantFormat::COUNT); ++f) {
        const QuantFormat fmt = QuantFormat(f);
        const int64_t n = 128;
        for (int trial = 0; trial < 100; ++trial) {
            std::vector<float> x((size_t)n), y((size_t)n);
            for (auto& v : x) v = nd(rng);
            std::vector<uint8_t> q((size_t)quant_row_bytes(fmt, n));
            const QuantLevels lv = ops::quant_levels(fmt, n);
            quantize_row(fmt, x.data(), n, q.data(), lv.v);
            dequantize_row(fmt, q.data(), n, y.data(), lv.v);
            const int blk = quant_block_elems(fmt) ? quant_block_elems(fmt) : int(n);
            for (int64_t b0 = 0; b0 < n; b0 += blk) {
                float lo = x[size_t(b0)], hi = lo, amax = 0;
                for (int64_t i = b0; i < b0 + blk; ++i) {
                    lo = std::min(lo, x[size_t(i)]);
                    hi = std::max(hi, x[size_t(i)]);
                    amax = std::max(amax, std::fabs(x[size_t(i)]));
                }
                double bound = 0;
                switch (fmt) {
                    case QuantFormat::Q8: bound = (hi - lo) / 255.0 * 0.5 * 1.0001 + 1e-6; break;
                    case QuantFormat::Q4: bound = (hi - lo) / 15.0 * 0.5 * 1.0001 + 1e-6; break;
                    // widest gap between adjacent levels: -1 .. -0.6962 (0.3038), so half of it
                    case QuantFormat::NF4: bound = amax * (1.0 - 0.6961928009986877) / 2.0 * 1.0001 + 1e-6; break;
                    // d is rounded to f16 (relative 2^-11), which moves the grid by up to 127 * d * 2^-11.
                    case QuantFormat::Q8_0: bound = amax / 127.0 * (0.5 + 127.0 / 2048.0) + 1e-6; break;
                    case QuantFormat::Q4_0: bound = amax / 8.0 * (1.0 + 8.0 / 2048.0) + 1e-6; break;
                    // half a code step relative to the row's largest value (fp_formats_test: per element)
                    case QuantFormat::FP8_E4M3: bound = amax / 16.0 + 1e-6; break;
                    case QuantFormat::FP8_E5M2: bound = amax / 8.0 + 1e-6; break;
                    // the block scale bamax / 6, rounded to E4M3 (1/16); MXFP4: 2 X <= amax / 2
                    case QuantFormat::NVFP4: bound = amax / 6.0 * (1.0 + 1.0 / 16.0) + 1e-6; break;
                    case QuantFormat::MXFP4: bound = amax / 2.0 + 1e-6; break;
                    default: {
                        // TurboQuant (turboquant_test has the tight checks): an element's error is at
                        // most the row's L2 error. Values: half a step s <= 2 |x| / (2^b - 1) per
                        // rotated coordinate. Keys decode to a row of norm |x|: |e| <= 2 |x|.
                        double norm = 0;
                        for (float v : x) norm += double(v) * double(v);
                        norm = std::sqrt(norm);
                        const int b = tq_bits(fmt);
                        bound = tq_codebook(fmt) ? 2.0 * norm * 1.0001
                                                 : std::sqrt(double(n)) * norm / double((1 << b) - 1) * 1.0001 + 1e-5;
                        break;
                    }
                }
                for (int64_t i = b0; i < b0 + blk; ++i)
                    ASSERT_LE(std::fabs(double(y[size_t(i)]) - double(x[size_t(i)])), bound)
                        << ops::quant_format_name(fmt) << " element " << i << " x " << x[size_t(i)] << " y " << y[size_t(i)];
            }
        }
    }
}

TEST(QuantFormats, Q80AndQ40ByteLayout) {
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = float(i - 16) * 0.25f;  // -4 .. 3.75; amax 4 at i = 0
    uint8_t b8[34];
    quantize_block_q8_0(x, b8);
    const float d8 = 4.0f / 127.0f;
    EXPECT_EQ(uint16_t(b8[0] | b8[1] << 8), f32_to_f16(d8));  // little-endian f16 scale first
    for (int i = 0; i < 32; ++i) EXPECT_EQ(int(int8_t(b8[2 + i])), int(std::round(x[i] / d8))) << i;
    uint8_t b4[18];
    quantize_block_q4_0(x, b4);
    const float d4 = -4.0f / -8.0f;  // m = -4 (largest magnitude, signed) -> d = 0.5
    EXPECT_EQ(uint16_t(b4[0] | b4[1] << 8), f32_to_f16(d4));
    for (int j = 0; j < 16; ++j) {
        const int q0 = std::min(15, int(x[j] / d4 + 8.5f)), q1 = std::min(15, int(x[j + 16] / d4 + 8.5f));
        EXPECT_EQ(b4[2 + j] & 15, q0) << "low nibble holds element " << j;
        EXPECT_EQ(b4[2 + j] >> 4, q1) << "high nibble holds element " << j + 16;
    }
    EXPECT_EQ(quant_row_bytes(QuantFormat::Q8_0, 64) * 8.0 / 64, 8.5);
    EXPECT_EQ(quant_row_bytes(QuantFormat::Q4_0, 64) * 8.0 / 64, 4.5);
    EXPECT_EQ(quant_row_bytes(QuantFormat::NF4, 64) * 8.0 / 64, 4.5);
    EXPECT_EQ(quant_row_bytes(QuantFormat::Q8, 64) * 8.0 / 64, 9.0);  // 8 + 64/D
}

TEST(QuantFormats, OddRowsAreRejectedWithAClearMessage) {
    Tensor x = Tensor::zeros({2, 30}, DType::F32);
    try {
        ops::quantize(x, QuantFormat::Q4_0);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("a row of 30 values cannot be stored as q4_0; expected a multiple of 32"),
                  std::string::npos)
            << e.what();
    }
    Tensor odd = Tensor::zeros({2, 7}, DType::F32);
    EXPECT_THROW(ops::quantize(odd, QuantFormat::Q4), Error);
    EXPECT_NO_THROW(ops::quantize(odd, QuantFormat::Q8));
}

}  // namespace
}  // namespace kv
