// Element types shared by every backend, and the scalar conversions between them.
// The conversions are the single definition used by the CPU kernels, the CUDA kernels
// and the tests, so a bf16/f16 rounding rule cannot differ between backends.
#pragma once

#include <cstdint>
#include <cstring>

#include "hd.h"

namespace kv {

enum class DType : uint8_t {
    F32 = 0,
    F64,
    F16,
    BF16,
    I32,
    I64,
    U8,
    COUNT
};

KV_HD int dtype_size(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::F64: return 8;
        case DType::F16: return 2;
        case DType::BF16: return 2;
        case DType::I32: return 4;
        case DType::I64: return 8;
        case DType::U8: return 1;
        default: return 0;
    }
}

KV_HD bool dtype_is_float(DType t) {
    return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

KV_HD bool dtype_is_int(DType t) { return t == DType::I32 || t == DType::I64 || t == DType::U8; }

// ---- bit casts ---------------------------------------------------------------------------
KV_HD uint32_t f32_bits(float f) {
#if KV_DEVICE_PASS
    return __float_as_uint(f);
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
#endif
}

KV_HD float bits_f32(uint32_t u) {
#if KV_DEVICE_PASS
    return __uint_as_float(u);
#else
    float f;
    std::memcpy(&f, &u, 4);
    return f;
#endif
}

// ---- bfloat16: top 16 bits of an IEEE f32, round-to-nearest-even, NaN stays NaN ----------
KV_HD float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

KV_HD uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    return uint16_t(((u & 0x7fffffffu) > 0x7f800000u) ? quiet_nan : rounded);  // branch-free: vectorizes
}

// ---- IEEE binary16, round-to-nearest-even, subnormals and overflow to inf handled --------
KV_HD float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: value = man * 2^-24
            float f = float(man) * 5.9604644775390625e-8f;
            u = sign | f32_bits(f);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return bits_f32(u);
}

KV_HD uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
    if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520 -> inf
    if (a < 0x38800000u) {                                   // below the smallest normal 2^-14
        // subnormal: round(a_value / 2^-24) with ties to even
        float v = bits_f32(a) * 16777216.0f;                 // exact scaling by 2^24
        uint32_t r = uint32_t(v);
        float frac = v - float(r);
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
        return uint16_t(sign | r);
    }
    uint32_t mant_round = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
    return uint16_t(sign | ((mant_round - 0x38000000u) >> 13));
}

// ---- typed load/store used by generic kernels: every float type computes in f32 (f64 in f64)
struct bf16_t {
    uint16_t bits;
};
struct f16_t {
    uint16_t bits;
};

KV_HD float to_f32(float x) { return x; }
KV_HD double to_f32(double x) { return x; }
KV_HD float to_f32(bf16_t x) { return bf16_to_f32(x.bits); }
KV_HD float to_f32(f16_t x) { return f16_to_f32(x.bits); }

template <class T>
KV_HD T from_f32(float x);
template <>
KV_HD float from_f32<float>(float x) { return x; }
template <>
KV_HD bf16_t from_f32<bf16_t>(float x) { return bf16_t{f32_to_bf16(x)}; }
template <>
KV_HD f16_t from_f32<f16_t>(float x) { return f16_t{f32_to_f16(x)}; }

// Accumulator type for a storage type: f64 stays f64 (reference checks), the rest use f32.
template <class T>
struct acc_type {
    using type = float;
};
template <>
struct acc_type<double> {
    using type = double;
};

template <class T>
KV_HD T cast_from(typename acc_type<T>::type x) {
    return from_f32<T>(x);
}
template <>
KV_HD double cast_from<double>(double x) {
    return x;
}

}  // namespace kv
