// KIVI (Liu et al. 2024) 2- and 4-bit asymmetric quantization of a KV cache: one definition
// of the packed layout and its arithmetic, compiled for the CPU kernels, the CUDA kernel, the
// engine's buffer (engine/kv/buffers/buffer_kivi.cpp) and the tests alike.
//
// Slots are cut into groups of S consecutive slots (S = the group size). Per (batch row, KV
// head):
//   keys, per channel: group j, channel d holds S codes of `bits` bits (S*bits/8 bytes, token
//        t of the group at bit t*bits) and one f16 pair (scale, min) over the group's tokens:
//        kcodes (B, G, NG, D, S*bits/8) u8, kscales (B, G, NG, D, 2) f16.
//   values, per token: slot s holds D codes (channel d at bit d*bits) and one f16 pair per VG
//        consecutive channels (VG = min(S, D)): vcodes (B, G, L, D*bits/8) u8,
//        vscales (B, G, L, D/VG, 2) f16.
//   x = min + scale * code. min is rounded down and scale up to f16 before coding, so every
//   input of the group lies in [min, min + (2^bits - 1) scale] and |x - deq(x)| <= scale / 2
//   (plus f32 rounding of the products).
// Groups not yet packed (the full-precision residual window) live elsewhere; see the buffer.
#pragma once

#include <cstdint>

#include "dtype.h"
#include "hd.h"

namespace kv {

constexpr float kKiviF16Max = 65504.0f;

// Nearest f16 value <= v (>= v for kivi_f16_ceil), clamped to the finite f16 range.
KV_HD uint16_t kivi_f16_floor(float v) {
    v = v > kKiviF16Max ? kKiviF16Max : (v < -kKiviF16Max ? -kKiviF16Max : v);
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) <= v) return h;
    if (h & 0x8000u) return uint16_t(h + 1);  // negative: one step away from zero
    if ((h & 0x7fffu) == 0) return 0x8001u;   // +0 -> smallest negative subnormal
    return uint16_t(h - 1);
}
KV_HD uint16_t kivi_f16_ceil(float v) {
    v = v > kKiviF16Max ? kKiviF16Max : (v < -kKiviF16Max ? -kKiviF16Max : v);
    uint16_t h = f32_to_f16(v);
    if (f16_to_f32(h) >= v) return h;
    if (h & 0x8000u) return (h & 0x7fffu) == 1 ? uint16_t(0) : uint16_t(h - 1);  // negative: toward zero
    return uint16_t(h + 1);
}

KV_HD int kivi_qmax(int bits) { return (1 << bits) - 1; }

// Code i of a packed run (bits 2 or 4).
KV_HD int kivi_get_code(const uint8_t* p, int64_t i, int bits) {
    const int per = 8 / bits;
    return (p[i / per] >> ((i % per) * bits)) & kivi_qmax(bits);
}

// (scale, min) as f16 bits for values in [lo, hi].
KV_HD void kivi_params(float lo, float hi, int bits, uint16_t* scale_h, uint16_t* min_h) {
    *min_h = kivi_f16_floor(lo);
    const float mn = f16_to_f32(*min_h);
    const float s = (hi - mn) / float(kivi_qmax(bits));
    *scale_h = kivi_f16_ceil(s > 0.0f ? s : 0.0f);
}

// Nearest code of x for (scale, min), clamped to [0, qmax].
KV_HD int kivi_code(float x, float scale, float mn, int bits) {
    if (!(scale > 0.0f)) return 0;
    float c = (x - mn) / scale + 0.5f;
    const float qmax = float(kivi_qmax(bits));
    c = c < 0.0f ? 0.0f : (c > qmax ? qmax : c);
    return int(c);  // c >= 0: truncation = floor
}

KV_HD float kivi_dequant(int code, float scale, float mn) { return mn + scale * float(code); }

// Keys of one group, per channel: x[t * xs + d] for t < n (n <= S tokens, the rest coded 0),
// d < D -> codes (D, S*bits/8) and scales (D, 2) [scale, min] as f16 bits.
KV_HD void kivi_pack_key_group(const float* x, int64_t xs, int64_t n, int64_t S, int64_t D, int bits, uint8_t* codes,
                               uint16_t* scales) {
    const int64_t rb = S * bits / 8;
    for (int64_t d = 0; d < D; ++d) {
        float lo = x[d], hi = x[d];
        for (int64_t t = 1; t < n; ++t) {
            const float v = x[t * xs + d];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        uint16_t sh, mh;
        kivi_params(lo, hi, bits, &sh, &mh);
        scales[2 * d] = sh;
        scales[2 * d + 1] = mh;
        const float s = f16_to_f32(sh), mn = f16_to_f32(mh);
        uint8_t* row = codes + d * rb;
        for (int64_t i = 0; i < rb; ++i) row[i] = 0;
        for (int64_t t = 0; t < n; ++t) {
            const int c = kivi_code(x[t * xs + d], s, mn, bits);
            row[t / (8 / bits)] = uint8_t(row[t / (8 / bits)] | (c << ((t % (8 / bits)) * bits)));
        }
    }
}

// One token's values, per group of VG channels: x[d], d < D -> codes (D*bits/8) and scales
// (D/VG, 2) as f16 bits.
KV_HD void kivi_pack_value_row(const float* x, int64_t D, int64_t VG, int bits, uint8_t* codes, uint16_t* scales) {
    for (int64_t i = 0; i < D * bits / 8; ++i) codes[i] = 0;
    for (int64_t g = 0; g < D / VG; ++g) {
        float lo = x[g * VG], hi = x[g * VG];
        for (int64_t d = g * VG + 1; d < (g + 1) * VG; ++d) {
            lo = x[d] < lo ? x[d] : lo;
            hi = x[d] > hi ? x[d] : hi;
        }
        uint16_t sh, mh;
        kivi_params(lo, hi, bits, &sh, &mh);
        scales[2 * g] = sh;
        scales[2 * g + 1] = mh;
        const float s = f16_to_f32(sh), mn = f16_to_f32(mh);
        for (int64_t d = g * VG; d < (g + 1) * VG; ++d) {
            const int c = kivi_code(x[d], s, mn, bits);
            codes[d / (8 / bits)] = uint8_t(codes[d / (8 / bits)] | (c << ((d % (8 / bits)) * bits)));
        }
    }
}

// Key of token t of a packed group, channel d.
KV_HD float kivi_key_at(const uint8_t* codes, const uint16_t* scales, int64_t S, int bits, int64_t t, int64_t d) {
    return kivi_dequant(kivi_get_code(codes + d * (S * bits / 8), t, bits), f16_to_f32(scales[2 * d]), f16_to_f32(scales[2 * d + 1]));
}

// Value of one packed token, channel d.
KV_HD float kivi_value_at(const uint8_t* codes, const uint16_t* scales, int64_t VG, int bits, int64_t d) {
    const int64_t g = d / VG;
    return kivi_dequant(kivi_get_code(codes, d, bits), f16_to_f32(scales[2 * g]), f16_to_f32(scales[2 * g + 1]));
}

// Bytes per slot and KV head of the packed storage (codes + scales of K and V; the key
// scales of a group are spread over its S slots).
KV_HD int64_t kivi_code_bytes_per_slot(int64_t D, int bits) { return 2 * D * bits / 8; }
KV_HD int64_t kivi_value_group(int64_t S, int64_t D) { return S < D ? S : D; }

}  // namespace kv
