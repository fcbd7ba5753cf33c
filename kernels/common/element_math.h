// Per-element formulas shared by the CPU and CUDA kernels (one definition, two compilers).
// Keep these tiny and branch-free; loops and memory layout belong to the kernels.
#pragma once

#include <cmath>

#include "dtype.h"
#include "hd.h"

namespace kv {

// a * b + c in one rounding where the CPU kernel variant has FMA (AVX2, AVX-512); two
// roundings elsewhere. The build never contracts on its own (-ffp-contract=off), so this is
// where results may differ between variants (by an ulp of the exp polynomial's steps).
#if KV_NVCC
#define KV_HD_ALWAYS KV_HD
#else
// exp sits inside loops the vectorizer must see whole: a call left in the loop stops it
// (GCC 12 stopped inlining kv_expf_poly once its steps became kv_fmaf calls: SwiGLU 8x slower).
#define KV_HD_ALWAYS inline __attribute__((always_inline))
#endif

KV_HD_ALWAYS float kv_fmaf(float a, float b, float c) {
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);  // vfmadd, vectorized (no errno with -fno-math-errno)
#else
    return a * b + c;
#endif
}

// exp(x) for f32 in plain arithmetic so CPU loops vectorize (no libm call): Cody-Waite range
// reduction x = n ln2 + r, Cephes' minimax polynomial for e^r on [-ln2/2, ln2/2] (about 1.3
// ulp), then scaling by 2^n (in two steps when n = 128).
// Results below FLT_MIN flush to 0; NaN propagates; +inf/-inf give inf/0.
KV_HD_ALWAYS float kv_expf_poly(float x) {
    const float hi = 88.72283935546875f, lo = -87.33654022216797f;
    float xc = x > hi ? hi : x;
    xc = xc < lo ? lo : xc;
    xc = (xc == xc) ? xc : 0.0f;  // NaN: compute on 0 (int conversion of NaN is UB), restore below
    const float fn = std::floor(kv_fmaf(xc, 1.44269504088896341f, 0.5f));
    float r = kv_fmaf(fn, -0.693359375f, xc);
    r = kv_fmaf(fn, 2.12194440e-4f, r);
    const float z = r * r;
    float y = kv_fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    y = kv_fmaf(y, r, 8.3334519073e-3f);
    y = kv_fmaf(y, r, 4.1665795894e-2f);
    y = kv_fmaf(y, r, 1.6666665459e-1f);
    y = kv_fmaf(y, r, 5.0000001201e-1f);
    y = kv_fmaf(y, z, r) + 1.0f;
    const int n = int(fn);                        // in [-126, 128]
    const int e = n > 127 ? 127 : n;              // 2^128 is not a float: scale by 2^127 * 2
    y *= bits_f32(uint32_t(e + 127) << 23);
    y *= n > 127 ? 2.0f : 1.0f;
    // Special cases as multiplicative factors: GCC 12 vectorizes these, not `y = c ? k : y`.
    y *= x > hi ? bits_f32(0x7f800000u) : 1.0f;  // overflow -> inf
    y *= x < lo ? 0.0f : 1.0f;                   // underflow (and -inf) -> 0
    y *= (x == x) ? 1.0f : bits_f32(0x7fc00000u); // NaN -> NaN
    return y;
}

// tanh(x) for f32 without exp: Eigen's 13/6 rational interpolant (generic_fast_tanh_float),
// a few ulp on [-8, 8] (at most 2.8e-7 relative with FMA, 4e-7 without), x itself below 4e-4,
// +-1 beyond the clamp (the point where the interpolant reaches 1 differs with FMA).
// Half the work of 1 - 2 / (exp(2x) + 1), and no cancellation near 0. NaN propagates.
KV_HD_ALWAYS float kv_tanhf_poly(float x0) {
#if defined(__FMA__)
    const float c = 7.99881172180175781f;
#else
    const float c = 7.90531110763549805f;
#endif
    float x = x0 > c ? c : x0;
    x = x < -c ? -c : x;
    const float x2 = x * x;
    float p = kv_fmaf(x2, -2.76076847742355e-16f, 2.00018790482477e-13f);
    p = kv_fmaf(x2, p, -8.60467152213735e-11f);
    p = kv_fmaf(x2, p, 5.12229709037114e-08f);
    p = kv_fmaf(x2, p, 1.48572235717979e-05f);
    p = kv_fmaf(x2, p, 6.37261928875436e-04f);
    p = kv_fmaf(x2, p, 4.89352455891786e-03f);
    p = x * p;
    float q = kv_fmaf(x2, 1.19825839466702e-06f, 1.18534705686654e-04f);
    q = kv_fmaf(x2, q, 2.26843463243900e-03f);
    q = kv_fmaf(x2, q, 4.89352518554385e-03f);
    const float t = p / q;
    return (x0 < 0.0004f && x0 > -0.0004f) ? x0 : t;
}

#if KV_NVCC
KV_HD float kv_exp(float x) { return ::expf(x); }
KV_HD double kv_exp(double x) { return ::exp(x); }
KV_HD float kv_sqrt(float x) { return ::sqrtf(x); }
KV_HD double kv_sqrt(double x) { return ::sqrt(x); }
#else
KV_HD_ALWAYS float kv_exp(float x) { return kv_expf_poly(x); }
KV_HD double kv_exp(double x) { return std::exp(x); }
KV_HD float kv_sqrt(float x) { return std::sqrt(x); }
KV_HD double kv_sqrt(double x) { return std::sqrt(x); }
#endif

#if KV_NVCC
KV_HD float kv_tanh(float x) { return ::tanhf(x); }
KV_HD double kv_tanh(double x) { return ::tanh(x); }
#else
KV_HD_ALWAYS float kv_tanh(float x) { return kv_tanhf_poly(x); }
KV_HD double kv_tanh(double x) { return std::tanh(x); }
#endif

// The activations below are KV_HD_ALWAYS for the same reason as exp: GCC left kv_sigmoid<float>
// as a call per element inside the GEGLU loop (Gemma's MLP 2.5x slower than SwiGLU's).
template <class F>
KV_HD_ALWAYS F kv_sigmoid(F x) {
    return F(1) / (F(1) + kv_exp(-x));
}

// SiLU(x) = x * sigmoid(x)
template <class F>
KV_HD_ALWAYS F kv_silu(F x) {
    return x / (F(1) + kv_exp(-x));
}

// d/dx SiLU(x) = s + x s (1 - s), s = sigmoid(x)
template <class F>
KV_HD_ALWAYS F kv_silu_grad(F x) {
    F s = kv_sigmoid(x);
    return s * (F(1) + x * (F(1) - s));
}

// SwiGLU y = silu(g) u, both gradients from one exp:
//   dg = dy u silu'(g),  du = dy silu(g)
template <class F>
KV_HD_ALWAYS void kv_swiglu_grad(F g, F u, F dy, F* dg, F* du) {
    const F s = kv_sigmoid(g);
    *dg = dy * u * (s * (F(1) + g * (F(1) - s)));
    *du = dy * g * s;
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3).
template <class F>
KV_HD_ALWAYS F kv_gelu_tanh(F x) {
    const F u2 = F(2 * 0.7978845608028654) * (x + F(0.044715) * x * x * x);
    return x * kv_sigmoid(u2);
}

// GEGLU y = gelu_tanh(g) u: dg = dy u gelu'(g), du = dy gelu(g), with
// gelu'(x) = s + x s (1 - s) du2/dx, s = sigmoid(u2), du2/dx = 2 sqrt(2/pi) (1 + 3 0.044715 x^2).
template <class F>
KV_HD_ALWAYS void kv_geglu_grad(F g, F u, F dy, F* dg, F* du) {
    const F k2 = F(2 * 0.7978845608028654);
    const F s = kv_sigmoid(k2 * (g + F(0.044715) * g * g * g));
    *dg = dy * u * (s + g * s * (F(1) - s) * k2 * (F(1) + F(3 * 0.044715) * g * g));
    *du = dy * g * s;
}

// RMSNorm scale factor for a row with sum of squares `ss` over `n` elements.
template <class F>
KV_HD F kv_rms_inv(F ss, long long n, F eps) {
    return F(1) / kv_sqrt(ss / F(n) + eps);
}

// Rotate-half RoPE on one channel pair (x1 = channel i, x2 = channel i + n_rot/2):
//   y1 = x1 cos - x2 sin,  y2 = x2 cos + x1 sin
template <class F>
KV_HD void kv_rope_pair(F x1, F x2, F c, F s, F* y1, F* y2) {
    *y1 = x1 * c - x2 * s;
    *y2 = x2 * c + x1 * s;
}

// RMSNorm input gradient of one element: with r = rms_inv, g = dy w' and
// k = r^3 mean(g x) over the row,  dx = r g - x k.
template <class F>
KV_HD F kv_rmsnorm_dx(F g, F x, F r, F k) {
    return r * g - x * k;
}

// The transpose of kv_rope_pair (the RoPE gradient): [dx1, dx2] = R^T [dy1, dy2]
//   dx1 = dy1 cos + dy2 sin,  dx2 = dy2 cos - dy1 sin
template <class F>
KV_HD void kv_rope_pair_backward(F dy1, F dy2, F c, F s, F* dx1, F* dx2) {
    *dx1 = dy1 * c + dy2 * s;
    *dx2 = dy2 * c - dy1 * s;
}

}  // namespace kv
