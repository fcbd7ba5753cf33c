// Dequantization of every supported ggml type against an independent reference written here
// from the documented layouts with different code: each field is pulled out bit by bit from an
// LSB-first bit stream, f16 is decoded with ldexp, and the value is computed in double. Every
// f32 product in the production formulas is exact (f16 has 11 significant bits, scales <= 8 bits,
// quants <= 6 bits) and at most one final rounding happens, so results must match float(ref)
// exactly. Plus hand-computed blocks, bf16 output, row maps and the multi-threaded path.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "formats/gguf/gguf_dequant.h"
#include "gguf_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using Block = std::vector<uint8_t>;

// ---- independent reference ---------------------------------------------------------------
// Bit k of the block is bit (k % 8) of byte k / 8 (little-endian fields, LSB-first nibbles).
uint32_t bits(const Block& b, size_t offset, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; ++i) {
        size_t k = offset + size_t(i);
        v |= uint32_t((b[k / 8] >> (k % 8)) & 1u) << i;
    }
    return v;
}
int sext(uint32_t v, int n) { return (v & (1u << (n - 1))) ? int(v) - (1 << n) : int(v); }

double half(const Block& b, size_t byte) {
    uint32_t h = bits(b, byte * 8, 16);
    int e = int((h >> 10) & 31), m = int(h & 1023);
    double v = e == 0 ? std::ldexp(double(m), -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(double(1024 + m), e - 25);
    return (h & 0x8000) ? -v : v;
}

// 6-bit scale and min of sub-block s of a Q4_K/Q5_K super-block (scales start at byte 4).
void scale_min(const Block& b, int s, int& sc, int& mn) {
    const size_t base = 4 * 8;
    if (s < 4) {
        sc = int(bits(b, base + 8 * size_t(s), 6));
        mn = int(bits(b, base + 8 * size_t(s + 4), 6));
    } else {
        sc = int(bits(b, base + 8 * size_t(s + 4), 4) + 16 * bits(b, base + 8 * size_t(s - 4) + 6, 2));
        mn = int(bits(b, base + 8 * size_t(s + 4) + 4, 4) + 16 * bits(b, base + 8 * size_t(s) + 6, 2));
    }
}

double ref_element(GgmlType t, const Block& b, int e) {
    switch (t) {
        case GgmlType::Q8_0: return half(b, 0) * sext(bits(b, size_t(2 + e) * 8, 8), 8);
        case GgmlType::Q4_0: return half(b, 0) * (int(bits(b, size_t(2 + e % 16) * 8 + 4 * size_t(e / 16), 4)) - 8);
        case GgmlType::Q4_1:
            return half(b, 0) * int(bits(b, size_t(4 + e % 16) * 8 + 4 * size_t(e / 16), 4)) + half(b, 2);
        case GgmlType::Q5_0: {
            int q = int(bits(b, size_t(6 + e % 16) * 8 + 4 * size_t(e / 16), 4) + 16 * bits(b, 2 * 8 + size_t(e), 1));
            return half(b, 0) * (q - 16);
        }
        case GgmlType::Q5_1: {
            int q = int(bits(b, size_t(8 + e % 16) * 8 + 4 * size_t(e / 16), 4) + 16 * bits(b, 4 * 8 + size_t(e), 1));
            return half(b, 0) * q + half(b, 2);
        }
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: {
            const int g = e / 64, hi = (e / 32) % 2, l = e % 32;
            const size_t qs = t == GgmlType::Q4_K ? 16 : 48;
            int q = int(bits(b, (qs + size_t(32 * g + l)) * 8 + 4 * size_t(hi), 4));
            if (t == GgmlType::Q5_K) q += 16 * int(bits(b, size_t(16 + l) * 8 + size_t(2 * g + hi), 1));
            int sc, mn;
            scale_min(b, e / 32, sc, mn);
            return half(b, 0) * sc * q - half(b, 2) * mn;
        }
        case GgmlType::Q6_K: {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            int low = int(bits(b, size_t(64 * h + 32 * (k & 1) + l) * 8 + 4 * size_t(k >> 1), 4));
            int high = int(bits(b, size_t(128 + 32 * h + l) * 8 + 2 * size_t(k), 2));
            int scale = sext(bits(b, size_t(192 + 8 * h + 2 * k + l / 16) * 8, 8), 8);
            return half(b, 208) * scale * (low + 16 * high - 32);
        }
        case GgmlType::MXFP4: {  // OCP MX v1.0: E2M1 code (sign, 2 exponent bits, 1 mantissa bit) times 2^(E8M0 - 127)
            static const double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
            const uint32_t code = bits(b, size_t(1 + e % 16) * 8 + 4 * size_t(e / 16), 4);
            const double v = kE2M1[code & 7] * std::ldexp(1.0, int(bits(b, 0, 8)) - 127);
            return code & 8 ? -v : v;
        }
        default: return NAN;
    }
}

struct Fmt {
    GgmlType type;
    int block;   // elements
    int bytes;   // per block
    std::vector<size_t> halves;  // byte offsets of f16 fields
};

const std::vector<Fmt>& formats() {
    static const std::vector<Fmt> f = {
        {GgmlType::Q8_0, 32, 34, {0}},      {GgmlType::Q4_0, 32, 18, {0}},     {GgmlType::Q4_1, 32, 20, {0, 2}},
        {GgmlType::Q5_0, 32, 22, {0}},      {GgmlType::Q5_1, 32, 24, {0, 2}},  {GgmlType::Q4_K, 256, 144, {0, 2}},
        {GgmlType::Q5_K, 256, 176, {0, 2}}, {GgmlType::Q6_K, 256, 210, {208}}, {GgmlType::MXFP4, 32, 17, {}},
    };
    return f;
}

// Random bytes with finite f16 fields (exponent 31 would make every element inf/NaN).
Block random_blocks(const Fmt& f, int n, std::mt19937_64& rng) {
    Block b(size_t(n) * size_t(f.bytes));
    for (auto& x : b) x = uint8_t(rng());
    for (int i = 0; i < n; ++i)
        for (size_t h : f.halves) {
            uint8_t& hi = b[size_t(i) * size_t(f.bytes) + h + 1];
            if (((hi >> 2) & 31) == 31) hi = uint8_t(hi & ~0x04);
        }
    // MXFP4's E8M0 scale: 0xff is NaN and 2^(e - 127) with e near 254 overflows f32 times 6.
    if (f.type == GgmlType::MXFP4)
        for (int i = 0; i < n; ++i) b[size_t(i) * size_t(f.bytes)] %= 0xf0;
    return b;
}

Block block_of(const Block& all, const Fmt& f, int i) {
    return Block(all.begin() + long(i) * f.bytes, all.begin() + long(i + 1) * f.bytes);
}

// ---- tests ---------------------------------------------------------------------------------
TEST(GgufDequant, TypeSizesMatchTheLayouts) {
    for (const Fmt& f : formats()) {
        const GgmlTypeTraits& tr = ggml_type_info(f.type);
        EXPECT_EQ(tr.block_size, f.block) << tr.name;
        EXPECT_EQ(tr.type_size, f.bytes) << tr.name;
        EXPECT_TRUE(gguf_can_dequantize(f.type)) << tr.name;
    }
    EXPECT_TRUE(gguf_can_dequantize(GgmlType::F32));
    EXPECT_TRUE(gguf_can_dequantize(GgmlType::F16));
    EXPECT_TRUE(gguf_can_dequantize(GgmlType::BF16));
    EXPECT_FALSE(gguf_can_dequantize(GgmlType::Q2_K));
    EXPECT_FALSE(gguf_can_dequantize(GgmlType::IQ4_NL));
}

TEST(GgufDequant, RandomBlocksMatchBitLevelReference) {
    std::mt19937_64 rng(test::seed_for("GgufDequant.RandomBlocks"));
    for (const Fmt& f : formats()) {
        const int n = 64;
        Block all = random_blocks(f, n, rng);
        std::vector<float> got(size_t(n) * size_t(f.block));
        std::vector<uint16_t> got16(got.size());
        gguf_dequantize_f32(f.type, all.data(), int64_t(got.size()), got.data());
        gguf_dequantize_bf16(f.type, all.data(), int64_t(got.size()), got16.data());
        int bad = 0;
        for (int i = 0; i < n && bad < 5; ++i) {
            Block blk = block_of(all, f, i);
            for (int e = 0; e < f.block; ++e) {
                const float want = float(ref_element(f.type, blk, e));
                const size_t k = size_t(i) * size_t(f.block) + size_t(e);
                if (got[k] != want || got16[k] != f32_to_bf16(want)) {
                    ADD_FAILURE() << ggml_type_name(f.type) << " block " << i << " element " << e << ": got " << got[k]
                                  << " want " << want;
                    ++bad;
                }
            }
        }
    }
}

TEST(GgufDequant, PlainFloatTypes) {
    // Every f16 bit pattern, decoded independently (ldexp) — NaN stays NaN.
    Block f16(65536 * 2);
    for (uint32_t h = 0; h < 65536; ++h) {
        f16[2 * h] = uint8_t(h);
        f16[2 * h + 1] = uint8_t(h >> 8);
    }
    std::vector<float> out(65536);
    gguf_dequantize_f32(GgmlType::F16, f16.data(), 65536, out.data());
    for (uint32_t h = 0; h < 65536; ++h) {
        double want = half(f16, 2 * h);
        if (std::isnan(want))
            EXPECT_TRUE(std::isnan(out[h])) << h;
        else
            ASSERT_EQ(out[h], float(want)) << "f16 bits " << h;
    }
    // bf16: the top half of an f32.
    std::mt19937_64 rng(test::seed_for("GgufDequant.Plain"));
    Block bf(2 * 1000);
    for (auto& x : bf) x = uint8_t(rng());
    gguf_dequantize_f32(GgmlType::BF16, bf.data(), 1000, out.data());
    for (int i = 0; i < 1000; ++i) {
        uint32_t bits32 = (uint32_t(bf[size_t(2 * i)]) | uint32_t(bf[size_t(2 * i + 1)]) << 8) << 16;
        float want;
        std::memcpy(&want, &bits32, 4);
        if (std::isnan(want))
            EXPECT_TRUE(std::isnan(out[size_t(i)]));
        else
            EXPECT_EQ(out[size_t(i)], want);
    }
    // f32 is copied bit for bit.
    std::vector<float> src = {1.5f, -0.0f, 3e38f, 1e-45f};
    gguf_dequantize_f32(GgmlType::F32, reinterpret_cast<const uint8_t*>(src.data()), 4, out.data());
    EXPECT_EQ(std::memcmp(out.data(), src.data(), 16), 0);
}

// Hand-computed blocks: numbers worked out on paper from the layouts.
TEST(GgufDequant, HandComputedBlocks) {
    auto deq = [](GgmlType t, const Block& b) {
        std::vector<float> y(size_t(ggml_type_info(t).block_size));
        gguf_dequantize_f32(t, b.data(), int64_t(y.size()), y.data());
        return y;
    };
    {  // Q8_0: d = 0.25 (f16 0x3400); qs[3] = -128 -> -32; qs[31] = 5 -> 1.25
        Block b(34, 0);
        b[0] = 0x00, b[1] = 0x34;
        b[2 + 3] = 0x80;
        b[2 + 31] = 5;
        auto y = deq(GgmlType::Q8_0, b);
        EXPECT_EQ(y[3], -32.0f);
        EXPECT_EQ(y[31], 1.25f);
        EXPECT_EQ(y[0], 0.0f);
    }
    {  // Q4_0: d = 0.5; qs[0] = 0x1F: element 0 = (15-8)*0.5 = 3.5, element 16 = (1-8)*0.5 = -3.5
        Block b(18, 0x88);  // every nibble 8 -> 0
        b[0] = 0x00, b[1] = 0x38;
        b[2] = 0x1F;
        auto y = deq(GgmlType::Q4_0, b);
        EXPECT_EQ(y[0], 3.5f);
        EXPECT_EQ(y[16], -3.5f);
        EXPECT_EQ(y[1], 0.0f);
    }
    {  // Q4_1: d = 2, m = -1 (0xBC00); qs[15] = 0xA3: element 15 = 3*2-1 = 5, element 31 = 10*2-1 = 19
        Block b(20, 0);
        b[0] = 0x00, b[1] = 0x40, b[2] = 0x00, b[3] = 0xBC;
        b[4 + 15] = 0xA3;
        auto y = deq(GgmlType::Q4_1, b);
        EXPECT_EQ(y[15], 5.0f);
        EXPECT_EQ(y[31], 19.0f);
        EXPECT_EQ(y[0], -1.0f);
    }
    {  // Q5_0: d = 1; element 31 = low 15 (qs[15] high nibble) + 16 (qh bit 31) - 16 = 15; element 0 = -16
        Block b(22, 0);
        b[0] = 0x00, b[1] = 0x3C;
        b[5] = 0x80;        // qh bit 31
        b[6 + 15] = 0xF0;   // element 31 low bits
        auto y = deq(GgmlType::Q5_0, b);
        EXPECT_EQ(y[31], 15.0f);
        EXPECT_EQ(y[0], -16.0f);
        EXPECT_EQ(y[15], -16.0f);
    }
    {  // Q5_1: d = 0.5, m = -1; element 16 = (3 | 16) * 0.5 - 1 = 8.5
        Block b(24, 0);
        b[0] = 0x00, b[1] = 0x38, b[2] = 0x00, b[3] = 0xBC;
        b[4 + 2] = 0x01;    // qh bit 16
        b[8 + 0] = 0x30;    // element 16 low bits = 3
        auto y = deq(GgmlType::Q5_1, b);
        EXPECT_EQ(y[16], 8.5f);
        EXPECT_EQ(y[0], -1.0f);
    }
    {  // Q4_K: d = 1, dmin = 0.5.
        // scales[0] = 0x42 -> sc0 = 2 (high bits 01 feed sc4); scales[4] = 0xC3 -> mn0 = 3 (high bits 11 feed mn4)
        // scales[8] = 0x73 -> sc4 = 3 | 1<<4 = 19, mn4 = 7 | 3<<4 = 55
        Block b(144, 0);
        b[0] = 0x00, b[1] = 0x3C, b[2] = 0x00, b[3] = 0x38;
        b[4 + 0] = 0x42, b[4 + 4] = 0xC3, b[4 + 8] = 0x73;
        b[16 + 0] = 0x05;   // element 0 (group 0, low nibble, sub-block 0): q = 5
        b[16 + 64] = 0x0A;  // element 128 (group 2, low nibble, sub-block 4): q = 10
        auto y = deq(GgmlType::Q4_K, b);
        EXPECT_EQ(y[0], 1.0f * 2 * 5 - 0.5f * 3);        // 8.5
        EXPECT_EQ(y[128], 1.0f * 19 * 10 - 0.5f * 55);   // 162.5
        EXPECT_EQ(y[1], -1.5f);                          // q = 0 in sub-block 0
    }
    {  // Q5_K: d = 1, dmin = 0; sub-block 3 scale 1; element 101 (group 1, high nibble, l = 5):
        // qs[48 + 32 + 5] high nibble 2, qh[5] bit 3 -> q = 2 + 16 = 18
        Block b(176, 0);
        b[0] = 0x00, b[1] = 0x3C;
        b[4 + 3] = 1;
        b[48 + 32 + 5] = 0x20;
        b[16 + 5] = 0x08;
        auto y = deq(GgmlType::Q5_K, b);
        EXPECT_EQ(y[101], 18.0f);
        EXPECT_EQ(y[96], 0.0f);
    }
    {  // Q6_K: d = 2 (0x4000 at byte 208).
        // element 0: ql[0] low = 7, qh[0] bits 0-1 = 2 -> q = 7 + 32 - 32 = 7; scale[0] = -3 -> 2*-3*7 = -42
        // element 255 (h 1, k 3, l 31): ql[127] high = 15, qh[63] bits 6-7 = 3 -> q = 63 - 32 = 31;
        // scale[15] = 127 -> 2*127*31 = 7874
        Block b(210, 0);
        b[208] = 0x00, b[209] = 0x40;
        b[0] = 0x07, b[128] = 0x02, b[192] = uint8_t(-3);
        b[127] = 0xF0, b[128 + 63] = 0xC0, b[192 + 15] = 127;
        auto y = deq(GgmlType::Q6_K, b);
        EXPECT_EQ(y[0], -42.0f);
        EXPECT_EQ(y[255], 7874.0f);
        EXPECT_EQ(y[1], 2.0f * -3 * -32);  // all-zero quant = -32 with scale[0]
    }
}

TEST(GgufDequant, RowsWithMapAndThreads) {
    std::mt19937_64 rng(test::seed_for("GgufDequant.Rows"));
    for (const Fmt& f : formats()) {
        const int64_t row_len = 2 * 256, n_rows = 300;  // > 2^16 elements: the OpenMP path
        const int blocks_per_row = int(row_len / f.block);
        Block all = random_blocks(f, int(n_rows) * blocks_per_row, rng);
        std::vector<int64_t> map(static_cast<size_t>(n_rows));
        for (int64_t r = 0; r < n_rows; ++r) map[size_t(r)] = (r * 7 + 3) % n_rows;  // 7 is coprime to 300
        std::vector<float> out(size_t(n_rows * row_len), -999.0f);
        gguf_dequantize_rows(f.type, all.data(), n_rows, row_len, DType::F32, out.data(), map.data());
        std::vector<uint16_t> out16(out.size());
        gguf_dequantize_rows(f.type, all.data(), n_rows, row_len, DType::BF16, out16.data());
        for (int64_t r = 0; r < n_rows; r += 37) {
            for (int64_t c = 0; c < row_len; c += 13) {
                const int bi = int(r * blocks_per_row + c / f.block);
                const float want = float(ref_element(f.type, block_of(all, f, bi), int(c % f.block)));
                EXPECT_EQ(out[size_t(map[size_t(r)] * row_len + c)], want) << ggml_type_name(f.type) << " row " << r;
                EXPECT_EQ(out16[size_t(r * row_len + c)], f32_to_bf16(want)) << ggml_type_name(f.type) << " row " << r;
            }
        }
    }
}

TEST(GgufDequant, ErrorsNameTheTensor) {
    std::vector<uint8_t> b(1024);
    std::vector<float> y(256);
    gguf_test::expect_error([&] { gguf_dequantize_f32(GgmlType::Q2_K, b.data(), 256, y.data(), "x.gguf: tensor 'w'"); },
                            {"x.gguf: tensor 'w': ggml type Q2_K cannot be dequantized by kvlab; supported types: F32"});
    gguf_test::expect_error([&] { gguf_dequantize_f32(GgmlType::Q4_0, b.data(), 33, y.data(), "t"); },
                            {"t: 33 elements of type Q4_0 are not whole blocks of 32"});
}

}  // namespace
}  // namespace kv
