// e^x in f32 for the policies' softmaxes over shifted logits (policy_exp_sum_f32 in
// policy_math.cpp, finch's fused window pass in policy_finch_math.cpp): the reduction by ln 2
// split for floats (its high part has 14 significant bits, so k ln2_hi is exact for |k| <= 128)
// and Taylor to r^7 (truncation < 1e-8 relative on |r| <= ln2 / 2), 2^k put in the exponent
// bits, 0 below -87. Written once for a scalar and for GCC vectors: the same operations lane by
// lane (no contraction: the build uses -ffp-contract=off), so every width computes the same
// bits, and both callers give the same weights.
#pragma once

#include <cstring>

#include "engine/kv/policies/policy_vec.h"

namespace kv {

typedef int i32x2 __attribute__((vector_size(8)));
typedef int i32x4 __attribute__((vector_size(16)));
typedef int i32x8 __attribute__((vector_size(32)));
typedef int i32x16 __attribute__((vector_size(64)));

template <class T>
struct ExpfBits;
template <>
struct ExpfBits<float> {
    using type = int;
};
template <>
struct ExpfBits<f32x2> {
    using type = i32x2;
};
template <>
struct ExpfBits<f32x4> {
    using type = i32x4;
};
template <>
struct ExpfBits<f32x8> {
    using type = i32x8;
};
template <>
struct ExpfBits<f32x16> {
    using type = i32x16;
};

// Vectors go by reference: a vector returned by value would change the ABI with the ISA flags.
template <class T>
KV_POLICY_VEC_INLINE void expf_core(const T& in, T& y) {
    using I = typename ExpfBits<T>::type;
    const T lo = T{} - 88.0f, hi = T{} + 0.0f;
    T x = in < lo ? lo : in;
    x = x > hi ? hi : x;
    const float shifter = 0x1.8p23f;  // adding it rounds to an integer held in the low mantissa bits
    const T t = x * 1.44269504f + shifter;
    const T kf = t - shifter;
    const T r = (x - kf * 0x1.62e4p-1f) - kf * 1.42860682e-6f;
    T p = T{} + 1.0f / 5040.0f;
    const float c[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    for (float ci : c) p = p * r + ci;
    I k;
    int sh;
    std::memcpy(&k, &t, sizeof(I));
    std::memcpy(&sh, &shifter, sizeof(int));
    k = (k - sh + 127) << 23;
    T scale;
    std::memcpy(&scale, &k, sizeof(T));
    y = p * scale;
    y = x < -87.0f ? T{} : y;  // 2^k at the bottom of the normal range: 0
}

}  // namespace kv
