// A plain K-quant quantizer for tests (Q4_K, Q5_K, Q6_K): per-sub-block min/max scales, no
// search (llama.cpp's make_qkx/make_qx searches for better scales; any valid encoding will do
// here, since the tests compare two ways of computing with the same blocks). Written from the
// block layouts documented in kernels/common/packed_blocks.h; the tests verify it against the
// loader's dequantizer (round-trip error bounds).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/dtype.h"

namespace kv::kquant_test {

inline void put_half(uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    p[0] = uint8_t(h);
    p[1] = uint8_t(h >> 8);
}
inline float half_value(float v) { return f16_to_f32(f32_to_f16(v)); }

// The 12 scale bytes of Q4_K/Q5_K from eight 6-bit scales and mins (inverse of k_scale_min).
inline void pack_scales(const int sc[8], const int mn[8], uint8_t* s) {
    for (int k = 0; k < 4; ++k) {
        s[k] = uint8_t((sc[k] & 63) | ((sc[k + 4] >> 4) << 6));
        s[k + 4] = uint8_t((mn[k] & 63) | ((mn[k + 4] >> 4) << 6));
        s[k + 8] = uint8_t((sc[k + 4] & 15) | ((mn[k + 4] & 15) << 4));
    }
}

// Q4_K (bits 4) or Q5_K (bits 5): one super-block of 256 values into 144 / 176 bytes.
inline void quantize_qk_min(const float* x, int bits, uint8_t* out) {
    const int qmax = (1 << bits) - 1;
    float scale[8], minv[8];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        float lo = 0, hi = 0;  // the range always includes 0 (mins are subtracted, >= 0)
        for (int i = 0; i < 32; ++i) lo = std::min(lo, x[32 * j + i]), hi = std::max(hi, x[32 * j + i]);
        scale[j] = (hi - lo) / float(qmax);
        minv[j] = -lo;
        max_scale = std::max(max_scale, scale[j]);
        max_min = std::max(max_min, minv[j]);
    }
    const float d = half_value(max_scale / 63.0f), dmin = half_value(max_min / 63.0f);
    int sc[8], mn[8];
    for (int j = 0; j < 8; ++j) {
        sc[j] = d > 0 ? std::clamp(int(std::lround(scale[j] / d)), 0, 63) : 0;
        mn[j] = dmin > 0 ? std::clamp(int(std::lround(minv[j] / dmin)), 0, 63) : 0;
    }
    put_half(out, d);
    put_half(out + 2, dmin);
    pack_scales(sc, mn, out + 4);
    int q[256];
    for (int j = 0; j < 8; ++j) {
        const float D = d * float(sc[j]), M = dmin * float(mn[j]);
        for (int i = 0; i < 32; ++i) q[32 * j + i] = D > 0 ? std::clamp(int(std::lround((x[32 * j + i] + M) / D)), 0, qmax) : 0;
    }
    uint8_t* qs = out + (bits == 4 ? 16 : 48);
    uint8_t* qh = out + 16;
    if (bits == 5) std::fill(qh, qh + 32, uint8_t(0));
    for (int g = 0; g < 4; ++g)
        for (int l = 0; l < 32; ++l) {
            const int a = q[64 * g + l], b = q[64 * g + 32 + l];
            qs[32 * g + l] = uint8_t((a & 15) | ((b & 15) << 4));
            if (bits == 5) qh[l] = uint8_t(qh[l] | ((a >> 4) << (2 * g)) | ((b >> 4) << (2 * g + 1)));
        }
}

// Q6_K: one super-block of 256 values into 210 bytes (16 sub-blocks of 16, int8 scales).
inline void quantize_q6_k(const float* x, uint8_t* out) {
    float scale[16], max_scale = 0;
    for (int s = 0; s < 16; ++s) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[16 * s + i]));
        scale[s] = amax / 31.0f;
        max_scale = std::max(max_scale, scale[s]);
    }
    const float d = half_value(max_scale / 127.0f);
    int8_t sc[16];
    int q[256];
    for (int s = 0; s < 16; ++s) {
        sc[s] = int8_t(d > 0 ? std::clamp(int(std::lround(scale[s] / d)), 0, 127) : 0);
        const float D = d * float(sc[s]);
        for (int i = 0; i < 16; ++i) q[16 * s + i] = D > 0 ? std::clamp(int(std::lround(x[16 * s + i] / D)) + 32, 0, 63) : 32;
    }
    uint8_t* ql = out;
    uint8_t* qh = out + 128;
    std::fill(out, out + 192, uint8_t(0));
    for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        ql[64 * h + 32 * (k & 1) + l] = uint8_t(ql[64 * h + 32 * (k & 1) + l] | ((q[e] & 15) << (4 * (k >> 1))));
        qh[32 * h + l] = uint8_t(qh[32 * h + l] | ((q[e] >> 4) << (2 * k)));
    }
    for (int s = 0; s < 16; ++s) out[192 + s] = uint8_t(sc[s]);
    put_half(out + 208, d);
}

// A row-major matrix (n a multiple of 256 values) in format bits 4 (Q4_K), 5 (Q5_K) or 6 (Q6_K).
inline std::vector<uint8_t> quantize_k(const std::vector<float>& x, int bits) {
    const size_t bb = bits == 4 ? 144 : bits == 5 ? 176 : 210;
    std::vector<uint8_t> out(x.size() / 256 * bb);
    for (size_t b = 0; b < x.size() / 256; ++b) {
        if (bits == 6) quantize_q6_k(x.data() + 256 * b, out.data() + bb * b);
        else quantize_qk_min(x.data() + 256 * b, bits, out.data() + bb * b);
    }
    return out;
}

}  // namespace kv::kquant_test
