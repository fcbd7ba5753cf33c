// KV-buffer quantization formats: one definition of every block's layout and arithmetic,
// compiled for the CPU kernels, the CUDA kernels and the tests alike. A "row" is one token's
// vector (one head's D values, or all heads' G*D when blocks span heads), stored as bytes.
//
//   Q8    keys_values torch-quantized8: per-row asymmetric min-max, 8 bits, RNE rounding,
//         scale floored at FLT_EPSILON, int32 zero point NOT clamped. Row: D bytes, f32 scale,
//         i32 zero point.                                          bits/elem = 8 + 64/D
//   Q4    same with 4 bits; byte i = element i (high nibble) | element i + D/2 (low nibble).
//         Row: D/2 bytes, f32 scale, i32 zero point.               bits/elem = 4 + 64/D
//   NF4   bitsandbytes NF4: blocks of 64, f32 absmax, 16 fixed levels, nearest level (ties to
//         the lower level), even element in the high nibble. Block: 32 bytes + f32 absmax.
//                                                                  bits/elem = 4.5
//   Q8_0  llama.cpp: blocks of 32, f16 d = amax/127, int8 q = round-half-away(x/d).
//         Block: f16 d + 32 int8.                                  bits/elem = 8.5
//   Q4_0  llama.cpp: blocks of 32, f16 d = m / -8 (m = value of largest magnitude),
//         q = min(15, trunc(x/d + 8.5)); byte j = q[j] (low nibble) | q[j+16] (high nibble).
//         Block: f16 d + 16 bytes.                                 bits/elem = 4.5
//   FP8_E4M3 / FP8_E5M2  OCP 8-bit floating point (E4M3: bias 7, no inf, max 448, NaN
//         S.1111.111; E5M2: bias 15, IEEE-like, max 57344), round to nearest even, saturating.
//         One dynamic scale per row, s = amax / max: a row of one head (per-head scales) or of
//         all heads of a token. Row: n codes, f32 s; x = decode(code) * s.  bits/elem = 8 + 32/n
//   NVFP4 NVIDIA's FP4: E2M1 codes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, blocks of 16 with an E4M3
//         block scale, one f32 scale per row sg = amax / (448 * 6). Block scale code
//         e4m3((bamax / 6) / sg); x = e2m1(q) * (e4m3(code) * sg). Row: n/2 bytes (element 2j
//         in the low nibble, 2j + 1 in the high), n/16 E4M3 codes, f32 sg.
//                                                                  bits/elem = 4.5 + 32/n
//   MXFP4 OCP MX v1.0: blocks of 32 E2M1 codes sharing an E8M0 scale X = 2^(floor(log2
//         amax) - 2) (2: E2M1's largest exponent), elements e2m1(x / X), saturating at 6.
//         Block (ggml's block_mxfp4): E8M0 byte, 16 bytes (element j in the low nibble,
//         j + 16 in the high).                                     bits/elem = 4.25
//   TQK2/3/4 TurboQuant keys: the row (n a power of two, 16..4096) is rotated by a seeded
//         random Hadamard transform y = H S x / sqrt(n) (S: +-1 signs from tq_sign, H:
//         Sylvester's Hadamard matrix, applied as a fast Walsh-Hadamard transform); each
//         coordinate of y / |y| is coded as the nearest of 2^b levels (ties to the lower), the
//         Lloyd-Max codebook of one coordinate of a uniform unit vector in R^n (lloyd_max.h,
//         handed to the kernels as QuantLevels). Row: b-bit codes packed little-endian (code i
//         at bits [b i, b i + b)), f32 g = |x| / |Q(u)|: decoding keeps the row's norm, so the
//         working buffer's write-back re-codes a decoded row to the same codes (storing |x|
//         would shrink it by |Q(u)| at each write-back).             bits/elem = b + 32/n
//   TQV2/3/4/8 TurboQuant values: the same rotation, then uniform min-max codes over the
//         rotated row, q = rne((y - lo) / s), s = (hi - lo) / (2^b - 1). Row: packed b-bit
//         codes, f32 lo, f32 s.                                    bits/elem = b + 64/n
#pragma once

#include <cstdint>

#include "dtype.h"
#include "element_math.h"  // kv_sqrt
#include "hd.h"

namespace kv {

enum class QuantFormat : uint8_t { Q8 = 0, Q4, NF4, Q8_0, Q4_0, FP8_E4M3, FP8_E5M2, NVFP4, MXFP4, TQK2, TQK3, TQK4, TQV2, TQV3, TQV4, TQV8, COUNT };

// The TurboQuant key codebook of one row length and width (2^b <= 16 levels, ascending); the
// engine computes it (ops::quant_levels) and passes it with every QUANTIZE/DEQUANTIZE call.
struct QuantLevels {
    float v[16] = {};
};

// TurboQuant formats: the rotated codes' width (0 for other formats) and whether the codes
// are Lloyd-Max levels (keys) rather than uniform steps (values).
KV_HD int tq_bits(QuantFormat f) {
    switch (f) {
        case QuantFormat::TQK2:
        case QuantFormat::TQV2: return 2;
        case QuantFormat::TQK3:
        case QuantFormat::TQV3: return 3;
        case QuantFormat::TQK4:
        case QuantFormat::TQV4: return 4;
        case QuantFormat::TQV8: return 8;
        default: return 0;
    }
}
KV_HD bool tq_codebook(QuantFormat f) { return f == QuantFormat::TQK2 || f == QuantFormat::TQK3 || f == QuantFormat::TQK4; }
constexpr int64_t kTqMaxRow = 4096;  // the CUDA kernels' row buffer

// ---- traits ------------------------------------------------------------------------------
// Elements per block (0: the whole row is one block).
KV_HD int quant_block_elems(QuantFormat f) {
    switch (f) {
        case QuantFormat::NF4: return 64;
        case QuantFormat::Q8_0:
        case QuantFormat::Q4_0:
        case QuantFormat::MXFP4: return 32;
        case QuantFormat::NVFP4: return 16;
        default: return 0;
    }
}

// Whether a row of n elements can be stored in format f.
KV_HD bool quant_row_ok(QuantFormat f, int64_t n) {
    if (n <= 0) return false;
    switch (f) {
        case QuantFormat::Q8:
        case QuantFormat::FP8_E4M3:
        case QuantFormat::FP8_E5M2: return true;
        case QuantFormat::Q4: return n % 2 == 0;
        default:
            // the Hadamard transform needs a power of two; below 16 rows span heads (keys_values' rule)
            if (tq_bits(f)) return n >= 16 && n <= kTqMaxRow && (n & (n - 1)) == 0;
            return n % quant_block_elems(f) == 0;
    }
}

// Bytes of one stored row of n elements (scales and zero points included).
KV_HD int64_t quant_row_bytes(QuantFormat f, int64_t n) {
    switch (f) {
        case QuantFormat::Q8: return n + 8;
        case QuantFormat::Q4: return n / 2 + 8;
        case QuantFormat::NF4: return n / 64 * (32 + 4);
        case QuantFormat::Q8_0: return n / 32 * (2 + 32);
        case QuantFormat::Q4_0: return n / 32 * (2 + 16);
        case QuantFormat::FP8_E4M3:
        case QuantFormat::FP8_E5M2: return n + 4;
        case QuantFormat::NVFP4: return n / 2 + n / 16 + 4;
        case QuantFormat::MXFP4: return n / 32 * (1 + 16);
        default: return tq_bits(f) ? (n * tq_bits(f) + 7) / 8 + (tq_codebook(f) ? 4 : 8) : 0;
    }
}

// ---- unaligned scalar access (rows are byte arrays) ---------------------------------------
KV_HD void put_u32(uint8_t* p, uint32_t v) {
    p[0] = uint8_t(v);
    p[1] = uint8_t(v >> 8);
    p[2] = uint8_t(v >> 16);
    p[3] = uint8_t(v >> 24);
}
KV_HD uint32_t get_u32(const uint8_t* p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
KV_HD void put_f32(uint8_t* p, float v) { put_u32(p, f32_bits(v)); }
KV_HD float get_f32(const uint8_t* p) { return bits_f32(get_u32(p)); }
KV_HD void put_f16(uint8_t* p, float v) {
    uint16_t h = f32_to_f16(v);
    p[0] = uint8_t(h);
    p[1] = uint8_t(h >> 8);
}
KV_HD float get_f16(const uint8_t* p) { return f16_to_f32(uint16_t(p[0] | (p[1] << 8))); }

// Round half to even without depending on the FPU rounding mode: n = nearest integer, ties
// go to the even neighbour (valid for |x| < 2^23).
KV_HD float round_half_even(float x) {
    if (x != x) return 0.0f;                                // NaN: never convert it to an integer
    if (x >= 8388608.0f || x <= -8388608.0f) return x;      // already integral (and no int overflow)
    float r = float(int64_t(x >= 0.0f ? x + 0.5f : x - 0.5f));  // round half away from zero
    float diff = r - x;
    if (diff == 0.5f || diff == -0.5f) {  // a tie: pick the even one
        int64_t ri = int64_t(r);
        if (ri % 2 != 0) r -= (diff > 0.0f ? 1.0f : -1.0f);
    }
    return r;
}

// ---- Q8 / Q4 (keys_values torch-quantized) -----------------------------------------------
constexpr float kFltEpsilon = 1.1920928955078125e-07f;

KV_HD void quantize_row_minmax(const float* x, int64_t n, int bits, uint8_t* out) {
    const int qmax = (1 << bits) - 1;
    float lo = x[0], hi = x[0];
    for (int64_t i = 1; i < n; ++i) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    float scale = (hi - lo) / float(qmax);
    scale = scale > kFltEpsilon ? scale : kFltEpsilon;
    float zpf = 0.0f - round_half_even(lo / scale);
    zpf = zpf > 2147483520.0f ? 2147483520.0f : (zpf < -2147483520.0f ? -2147483520.0f : zpf);  // int32 range
    const int32_t zp = int32_t(zpf);
    const float inv = 1.0f / scale;
    const int64_t payload = bits == 8 ? n : n / 2;
    for (int64_t i = 0; i < payload; ++i) out[i] = 0;
    for (int64_t i = 0; i < n; ++i) {
        // clamp in float before converting, so huge or NaN inputs stay defined
        float qf = round_half_even(x[i] * inv) + float(zp);
        qf = qf < 0.0f ? 0.0f : (qf > float(qmax) ? float(qmax) : qf);
        const int q = int(qf);
        if (bits == 8) {
            out[i] = uint8_t(q);
        } else if (i < n / 2) {
            out[i] |= uint8_t(q << 4);
        } else {
            out[i - n / 2] |= uint8_t(q);
        }
    }
    put_f32(out + payload, scale);
    put_u32(out + payload + 4, uint32_t(zp));
}

KV_HD void dequantize_row_minmax(const uint8_t* in, int64_t n, int bits, float* y) {
    const int64_t payload = bits == 8 ? n : n / 2;
    const float scale = get_f32(in + payload);
    const int32_t zp = int32_t(get_u32(in + payload + 4));
    for (int64_t i = 0; i < n; ++i) {
        int32_t q;
        if (bits == 8) q = in[i];
        else q = i < n / 2 ? (in[i] >> 4) : (in[i - n / 2] & 0x0f);
        y[i] = float(q - zp) * scale;
    }
}

// ---- NF4 (bitsandbytes) ------------------------------------------------------------------
KV_HD float nf4_level(int q) {
    // The 16 NF4 levels (quantiles of N(0,1) normalised to [-1, 1]; 7 negative, 0, 8 positive).
    switch (q) {
        case 0: return -1.0f;
        case 1: return -0.6961928009986877f;
        case 2: return -0.5250730514526367f;
        case 3: return -0.39491748809814453f;
        case 4: return -0.28444138169288635f;
        case 5: return -0.18477343022823334f;
        case 6: return -0.09105003625154495f;
        case 7: return 0.0f;
        case 8: return 0.07958029955625534f;
        case 9: return 0.16093020141124725f;
        case 10: return 0.24611230194568634f;
        case 11: return 0.33791524171829224f;
        case 12: return 0.44070982933044434f;
        case 13: return 0.5626170039176941f;
        case 14: return 0.7229568362236023f;
        default: return 1.0f;
    }
}

// Nearest level by midpoint thresholds; a value exactly on a midpoint takes the lower level.
KV_HD int nf4_index(float v) {
    int q = 0;
    for (int k = 1; k < 16; ++k) {
        const float mid = 0.5f * (nf4_level(k - 1) + nf4_level(k));
        q += v > mid ? 1 : 0;
    }
    return q;
}

// One block of n (even, <= 64) elements: n/2 packed bytes then the f32 absmax.
KV_HD void quantize_block_nf4(const float* x, int64_t n, uint8_t* out) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float inv = amax > 0.0f ? 1.0f / amax : 0.0f;
    for (int64_t i = 0; i < n; i += 2) out[i / 2] = uint8_t((nf4_index(x[i] * inv) << 4) | nf4_index(x[i + 1] * inv));
    put_f32(out + n / 2, amax);
}

KV_HD void dequantize_block_nf4(const uint8_t* in, int64_t n, float* y) {
    const float amax = get_f32(in + n / 2);
    for (int64_t i = 0; i < n; i += 2) {
        y[i] = nf4_level(in[i / 2] >> 4) * amax;
        y[i + 1] = nf4_level(in[i / 2] & 0x0f) * amax;
    }
}

// ---- Q8_0 / Q4_0 (llama.cpp) -------------------------------------------------------------
KV_HD float round_half_away(float x) {
    if (x != x) return 0.0f;
    if (x >= 8388608.0f || x <= -8388608.0f) return x;
    return float(int64_t(x >= 0.0f ? x + 0.5f : x - 0.5f));
}

KV_HD void quantize_block_q8_0(const float* x, uint8_t* out) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int i = 0; i < 32; ++i) {
        float q = round_half_away(x[i] * id);  // |q| <= 127 by construction (NaN -> 0)
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        out[2 + i] = uint8_t(int8_t(q));
    }
}

KV_HD void dequantize_block_q8_0(const uint8_t* in, float* y) {
    const float d = get_f16(in);
    for (int i = 0; i < 32; ++i) y[i] = d * float(int8_t(in[2 + i]));
}

KV_HD void quantize_block_q4_0(const float* x, uint8_t* out) {
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        if (a > amax) {
            amax = a;
            m = x[i];
        }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(out, d);
    for (int j = 0; j < 16; ++j) {
        // trunc(x/d + 8.5) lies in [0.5, 16.5) by construction; clamp first so NaN stays defined
        float f0 = x[j] * id + 8.5f, f1 = x[j + 16] * id + 8.5f;
        f0 = f0 >= 0.0f ? (f0 < 15.0f ? f0 : 15.0f) : 0.0f;
        f1 = f1 >= 0.0f ? (f1 < 15.0f ? f1 : 15.0f) : 0.0f;
        const int q0 = int(f0), q1 = int(f1);
        out[2 + j] = uint8_t(q0 | (q1 << 4));
    }
}

KV_HD void dequantize_block_q4_0(const uint8_t* in, float* y) {
    const float d = get_f16(in);
    for (int j = 0; j < 16; ++j) {
        y[j] = float(int(in[2 + j] & 0x0f) - 8) * d;
        y[j + 16] = float(int(in[2 + j] >> 4) - 8) * d;
    }
}

// ---- minifloats: OCP FP8 (E4M3, E5M2), E2M1 (FP4) and E8M0 scales --------------------------
// f32 -> a sign-magnitude minifloat with M mantissa bits and exponent bias `bias`: round to
// nearest, ties to the even code, |x| > maxv (inf included) saturates to max_code; the sign bit
// (bit sign_bit) follows x, so -0 and tiny negatives give negative zero. NaN gives nan_code.
// All steps are exact in f32: the scaling by 2^-(e - M) is a power of two.
KV_HD uint8_t minifloat_encode(float x, int M, int bias, float maxv, uint8_t max_code, uint8_t nan_code, int sign_bit) {
    if (x != x) return nan_code;
    const uint32_t xb = f32_bits(x);
    const uint8_t s = uint8_t((xb >> 31) << sign_bit);
    const float a = bits_f32(xb & 0x7fffffffu);
    if (a > maxv) return uint8_t(s | max_code);
    int e = int((xb >> 23) & 0xffu) - 127;  // floor(log2 a) for a normal f32
    const int emin = 1 - bias;
    if (e < emin) e = emin;  // the target's subnormal range (f32 subnormals and 0 included)
    const float inv_q = bits_f32(uint32_t(127 - (e - M)) << 23);  // 2^-(e - M): the code step's inverse
    int n = int(round_half_even(a * inv_q));  // in [0, 2^(M+1)]; never past maxv (a <= maxv is representable)
    if (n == (2 << M)) e += 1, n = 1 << M;    // rounded up into the next binade
    const int field = n >= (1 << M) ? e + bias : 0;
    const int mant = n >= (1 << M) ? n - (1 << M) : n;
    return uint8_t(s | (field << M) | mant);
}

// The magnitude of a finite code (no specials): subnormal m * 2^(1-bias-M), normal (2^M + m) * 2^(E-bias-M).
KV_HD float minifloat_decode(uint8_t c, int M, int bias, int sign_bit) {
    const int field = (c >> M) & ((1 << (sign_bit - M)) - 1), mant = c & ((1 << M) - 1);
    const int e = (field == 0 ? 1 : field) - bias - M;
    const float v = float(field == 0 ? mant : (1 << M) + mant) * bits_f32(uint32_t(127 + e) << 23);
    return (c >> sign_bit) & 1 ? -v : v;
}

constexpr float kE4M3Max = 448.0f, kE5M2Max = 57344.0f, kE2M1Max = 6.0f;

KV_HD uint8_t f32_to_e4m3(float x) { return minifloat_encode(x, 3, 7, kE4M3Max, 0x7e, 0x7f, 7); }
KV_HD float e4m3_to_f32(uint8_t c) { return (c & 0x7f) == 0x7f ? bits_f32(0x7fc00000u) : minifloat_decode(c, 3, 7, 7); }
KV_HD uint8_t f32_to_e5m2(float x) { return minifloat_encode(x, 2, 15, kE5M2Max, 0x7b, 0x7f, 7); }
KV_HD float e5m2_to_f32(uint8_t c) {
    if ((c & 0x7c) != 0x7c) return minifloat_decode(c, 2, 15, 7);
    if (c & 0x03) return bits_f32(0x7fc00000u);  // S.11111.mm, mm != 0: NaN
    return bits_f32(c & 0x80 ? 0xff800000u : 0x7f800000u);
}
// E2M1 has no NaN: NaN encodes as 0.
KV_HD uint8_t f32_to_e2m1(float x) { return minifloat_encode(x, 1, 1, kE2M1Max, 0x7, 0x0, 3); }
KV_HD float e2m1_to_f32(uint8_t c) { return minifloat_decode(uint8_t(c & 0xf), 1, 1, 3); }
// E8M0 (OCP MX scale): 2^(c - 127), 0xff NaN; code 0 is 2^-127, an f32 subnormal.
KV_HD float e8m0_to_f32(uint8_t c) {
    if (c == 0xff) return bits_f32(0x7fc00000u);
    return c == 0 ? bits_f32(0x00400000u) : bits_f32(uint32_t(c) << 23);
}
// floor(log2 a) for finite a > 0 (f32 subnormals included).
KV_HD int floor_log2_f32(float a) {
    const uint32_t b = f32_bits(a) & 0x7fffffffu;
    if (b >> 23) return int(b >> 23) - 127;
    int e = -127;
    for (uint32_t m = b; m < (1u << 22); m <<= 1) --e;  // subnormal: m * 2^-149
    return e;
}

// ---- FP8 rows -----------------------------------------------------------------------------
KV_HD void quantize_row_fp8(const float* x, int64_t n, bool e5m2, uint8_t* out) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float s = amax / (e5m2 ? kE5M2Max : kE4M3Max);
    for (int64_t i = 0; i < n; ++i) out[i] = s > 0.0f ? (e5m2 ? f32_to_e5m2(x[i] / s) : f32_to_e4m3(x[i] / s)) : uint8_t(0);
    put_f32(out + n, s);
}

KV_HD void dequantize_row_fp8(const uint8_t* in, int64_t n, bool e5m2, float* y) {
    const float s = get_f32(in + n);
    for (int64_t i = 0; i < n; ++i) y[i] = (e5m2 ? e5m2_to_f32(in[i]) : e4m3_to_f32(in[i])) * s;
}

// ---- NVFP4 rows ---------------------------------------------------------------------------
KV_HD void quantize_row_nvfp4(const float* x, int64_t n, uint8_t* out) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    const float sg = amax / (kE4M3Max * kE2M1Max);
    uint8_t* scales = out + n / 2;
    for (int64_t b = 0; b < n / 16; ++b) {
        const float* xb = x + b * 16;
        float bamax = 0.0f;
        for (int i = 0; i < 16; ++i) {
            const float a = xb[i] < 0.0f ? -xb[i] : xb[i];
            bamax = a > bamax ? a : bamax;
        }
        const uint8_t sc = sg > 0.0f ? f32_to_e4m3((bamax / kE2M1Max) / sg) : uint8_t(0);
        const float d = e4m3_to_f32(sc) * sg;
        scales[b] = sc;
        for (int i = 0; i < 16; i += 2) {
            const uint8_t lo = d > 0.0f ? f32_to_e2m1(xb[i] / d) : uint8_t(0), hi = d > 0.0f ? f32_to_e2m1(xb[i + 1] / d) : uint8_t(0);
            out[b * 8 + i / 2] = uint8_t(lo | (hi << 4));
        }
    }
    put_f32(out + n / 2 + n / 16, sg);
}

KV_HD void dequantize_row_nvfp4(const uint8_t* in, int64_t n, float* y) {
    const float sg = get_f32(in + n / 2 + n / 16);
    for (int64_t b = 0; b < n / 16; ++b) {
        const float d = e4m3_to_f32(in[n / 2 + b]) * sg;
        for (int i = 0; i < 16; i += 2) {
            const uint8_t byte = in[b * 8 + i / 2];
            y[b * 16 + i] = e2m1_to_f32(byte & 0xf) * d;
            y[b * 16 + i + 1] = e2m1_to_f32(byte >> 4) * d;
        }
    }
}

// ---- MXFP4 blocks -------------------------------------------------------------------------
KV_HD void quantize_block_mxfp4(const float* x, uint8_t* out) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) {
        const float a = x[i] < 0.0f ? -x[i] : x[i];
        amax = a > amax ? a : amax;
    }
    int se = amax > 0.0f && amax <= 3.4028234663852886e38f ? floor_log2_f32(amax) - 2 : -127;
    se = se < -127 ? -127 : (se > 127 ? 127 : se);
    out[0] = uint8_t(se + 127);
    const float X = e8m0_to_f32(out[0]);
    for (int j = 0; j < 16; ++j) out[1 + j] = uint8_t(f32_to_e2m1(x[j] / X) | (f32_to_e2m1(x[j + 16] / X) << 4));
}

KV_HD void dequantize_block_mxfp4(const uint8_t* in, float* y) {
    const float X = e8m0_to_f32(in[0]);
    for (int j = 0; j < 16; ++j) {
        y[j] = e2m1_to_f32(in[1 + j] & 0xf) * X;
        y[j + 16] = e2m1_to_f32(in[1 + j] >> 4) * X;
    }
}

// ---- TurboQuant rows ----------------------------------------------------------------------
// The rotation's seed: one fixed rotation for every row, so stored codes decode anywhere.
constexpr uint64_t kTurboQuantSeed = 0x7475726271756e74ull;  // "turbqunt"

// Sign i of the rotation's diagonal S: the low bit of splitmix64(seed + i).
KV_HD float tq_sign(int64_t i) {
    uint64_t z = kTurboQuantSeed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z & 1) ? -1.0f : 1.0f;
}

// In place y = H y / sqrt(n) (n a power of two; H symmetric with H H = n I, so it is its own inverse).
KV_HD void tq_hadamard(float* y, int64_t n) {
    for (int64_t h = 1; h < n; h *= 2)
        for (int64_t i = 0; i < n; i += 2 * h)
            for (int64_t j = i; j < i + h; ++j) {
                const float a = y[j], b = y[j + h];
                y[j] = a + b;
                y[j + h] = a - b;
            }
    int k = 0;
    while ((int64_t(1) << k) < n) ++k;
    // 1/sqrt(n) = 2^(-k/2): a power of two, times 1/sqrt(2) when k is odd
    float s = bits_f32(uint32_t(127 - k / 2) << 23);
    if (k % 2) s *= 0.7071067811865475244f;
    for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

KV_HD void tq_put_code(uint8_t* out, int64_t i, int b, uint32_t q) {
    const int64_t bit = i * b;
    const uint32_t v = q << (bit & 7);
    out[bit >> 3] = uint8_t(out[bit >> 3] | (v & 0xffu));
    if ((bit & 7) + b > 8) out[(bit >> 3) + 1] = uint8_t(out[(bit >> 3) + 1] | (v >> 8));
}
KV_HD uint32_t tq_get_code(const uint8_t* in, int64_t i, int b) {
    const int64_t bit = i * b;
    uint32_t v = in[bit >> 3];
    if ((bit & 7) + b > 8) v |= uint32_t(in[(bit >> 3) + 1]) << 8;
    return (v >> (bit & 7)) & ((1u << b) - 1u);
}

// Rotates y (n values, overwritten) and codes it into quant_row_bytes(f, n) bytes.
KV_HD void quantize_row_tq_inplace(QuantFormat f, float* y, int64_t n, uint8_t* out, const float* levels) {
    const int b = tq_bits(f);
    for (int64_t i = 0; i < n; ++i) y[i] *= tq_sign(i);
    tq_hadamard(y, n);
    const int64_t payload = (n * b + 7) / 8;
    for (int64_t i = 0; i < payload; ++i) out[i] = 0;
    if (tq_codebook(f)) {
        float ss = 0.0f;
        for (int64_t i = 0; i < n; ++i) ss += y[i] * y[i];
        const float norm = ss > 0.0f ? kv_sqrt(ss) : 0.0f;
        const float inv = norm > 0.0f ? 1.0f / norm : 0.0f;
        const int K = 1 << b;
        float cs = 0.0f;  // |Q(u)|^2
        for (int64_t i = 0; i < n; ++i) {
            const float u = y[i] * inv;
            uint32_t q = 0;
            for (int k = 1; k < K; ++k) q += u > 0.5f * (levels[k - 1] + levels[k]) ? 1u : 0u;
            tq_put_code(out, i, b, q);
            cs += levels[q] * levels[q];
        }
        put_f32(out + payload, cs > 0.0f ? norm / kv_sqrt(cs) : 0.0f);
        return;
    }
    float lo = y[0], hi = y[0];
    for (int64_t i = 1; i < n; ++i) {
        lo = y[i] < lo ? y[i] : lo;
        hi = y[i] > hi ? y[i] : hi;
    }
    const float qmax = float((1 << b) - 1);
    const float s = (hi - lo) / qmax;
    for (int64_t i = 0; i < n; ++i) {
        float q = s > 0.0f ? round_half_even((y[i] - lo) / s) : 0.0f;
        q = q < 0.0f ? 0.0f : (q > qmax ? qmax : q);  // NaN rows: round_half_even gives 0
        tq_put_code(out, i, b, uint32_t(q));
    }
    put_f32(out + payload, lo);
    put_f32(out + payload + 4, s);
}

KV_HD void dequantize_row_tq(QuantFormat f, const uint8_t* in, int64_t n, float* y, const float* levels) {
    const int b = tq_bits(f);
    const int64_t payload = (n * b + 7) / 8;
    if (tq_codebook(f)) {
        const float norm = get_f32(in + payload);
        for (int64_t i = 0; i < n; ++i) y[i] = levels[tq_get_code(in, i, b)] * norm;
    } else {
        const float lo = get_f32(in + payload), s = get_f32(in + payload + 4);
        for (int64_t i = 0; i < n; ++i) y[i] = lo + float(tq_get_code(in, i, b)) * s;
    }
    tq_hadamard(y, n);  // x = S H y / sqrt(n)
    for (int64_t i = 0; i < n; ++i) y[i] *= tq_sign(i);
}

// ---- rows ---------------------------------------------------------------------------------
// Quantize one row of n elements (quant_row_ok(f, n) must hold) into quant_row_bytes(f, n) bytes.
// levels: the TurboQuant key codebook (QuantLevels::v), read by TQK formats only.
KV_HD void quantize_row(QuantFormat f, const float* x, int64_t n, uint8_t* out, const float* levels = nullptr) {
    if (tq_bits(f)) {
#if !KV_DEVICE_PASS
        float y[kTqMaxRow];  // the rotation needs a copy (device kernels use quantize_row_inplace)
        for (int64_t i = 0; i < n; ++i) y[i] = x[i];
        quantize_row_tq_inplace(f, y, n, out, levels);
#endif
        return;
    }
    switch (f) {
        case QuantFormat::Q8: quantize_row_minmax(x, n, 8, out); break;
        case QuantFormat::Q4: quantize_row_minmax(x, n, 4, out); break;
        case QuantFormat::NF4:
            for (int64_t b = 0; b < n / 64; ++b) quantize_block_nf4(x + b * 64, 64, out + b * 36);
            break;
        case QuantFormat::Q8_0:
            for (int64_t b = 0; b < n / 32; ++b) quantize_block_q8_0(x + b * 32, out + b * 34);
            break;
        case QuantFormat::Q4_0:
            for (int64_t b = 0; b < n / 32; ++b) quantize_block_q4_0(x + b * 32, out + b * 18);
            break;
        case QuantFormat::FP8_E4M3: quantize_row_fp8(x, n, false, out); break;
        case QuantFormat::FP8_E5M2: quantize_row_fp8(x, n, true, out); break;
        case QuantFormat::NVFP4: quantize_row_nvfp4(x, n, out); break;
        case QuantFormat::MXFP4:
            for (int64_t b = 0; b < n / 32; ++b) quantize_block_mxfp4(x + b * 32, out + b * 17);
            break;
        default: break;
    }
}

KV_HD void dequantize_row(QuantFormat f, const uint8_t* in, int64_t n, float* y, const float* levels = nullptr) {
    if (tq_bits(f)) return dequantize_row_tq(f, in, n, y, levels);
    switch (f) {
        case QuantFormat::Q8: dequantize_row_minmax(in, n, 8, y); break;
        case QuantFormat::Q4: dequantize_row_minmax(in, n, 4, y); break;
        case QuantFormat::NF4:
            for (int64_t b = 0; b < n / 64; ++b) dequantize_block_nf4(in + b * 36, 64, y + b * 64);
            break;
        case QuantFormat::Q8_0:
            for (int64_t b = 0; b < n / 32; ++b) dequantize_block_q8_0(in + b * 34, y + b * 32);
            break;
        case QuantFormat::Q4_0:
            for (int64_t b = 0; b < n / 32; ++b) dequantize_block_q4_0(in + b * 18, y + b * 32);
            break;
        case QuantFormat::FP8_E4M3: dequantize_row_fp8(in, n, false, y); break;
        case QuantFormat::FP8_E5M2: dequantize_row_fp8(in, n, true, y); break;
        case QuantFormat::NVFP4: dequantize_row_nvfp4(in, n, y); break;
        case QuantFormat::MXFP4:
            for (int64_t b = 0; b < n / 32; ++b) dequantize_block_mxfp4(in + b * 17, y + b * 32);
            break;
        default: break;
    }
}

// quantize_row for kernels that hold the row in a scratch buffer x, which may be overwritten
// (TurboQuant rotates in place there instead of in a copy).
KV_HD void quantize_row_inplace(QuantFormat f, float* x, int64_t n, uint8_t* out, const float* levels) {
    if (tq_bits(f)) quantize_row_tq_inplace(f, x, n, out, levels);
    else quantize_row(f, x, n, out);
}

}  // namespace kv
