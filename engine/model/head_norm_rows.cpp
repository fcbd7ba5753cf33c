// Per-head RMSNorm of a fused projection, per ISA level (see head_norm_rows.h).
#include "engine/backend/host_parallel.h"
#include "engine/model/head_norm_rows.h"

#include <omp.h>

#include "engine/model/host_simd.h"
#include "kernels/common/element_math.h"

namespace kv::head_norm_rows {

namespace {

KV_HOST_SIMD_INLINE void normalise_body(const float* qkv, int64_t t0, int64_t t1, int64_t heads, int64_t hs, const float* w,
                                        float eps, float* out) {
    const int64_t W = heads * hs;
    for (int64_t t = t0; t < t1; ++t)
        for (int64_t h = 0; h < heads; ++h) {
            const float* x = qkv + t * W + h * hs;
            const float* wh = w + h * hs;
            float* y = out + t * W + h * hs;
            float ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < hs; ++i) ss += x[i] * x[i];
            const float inv = kv_rms_inv(ss, hs, eps);
#pragma omp simd
            for (int64_t i = 0; i < hs; ++i) y[i] = x[i] * inv * wh[i];
        }
}

KV_HOST_SIMD_VARIANTS(normalise,
                      (const float* qkv, int64_t t0, int64_t t1, int64_t heads, int64_t hs, const float* w, float eps, float* out),
                      (qkv, t0, t1, heads, hs, w, eps, out))

}  // namespace

void normalise(const float* qkv, int64_t rows, int64_t heads, int64_t hs, const float* w, float eps, float* out) {
    if (rows * heads * hs < 32768) {  // small calls (decode steps): no parallel region
        normalise_any(qkv, 0, rows, heads, hs, w, eps, out);
        return;
    }
    host_parallel_rows(rows, [&](int64_t r0, int64_t r1) { normalise_any(qkv, r0, r1, heads, hs, w, eps, out); });
}

}  // namespace kv::head_norm_rows
