// The final logit soft-cap on f32 logits (see softcap_rows.h).
#include "engine/model/softcap_rows.h"

#include <algorithm>

#include "engine/model/host_simd.h"
#include "kernels/common/element_math.h"

namespace kv {

namespace {

KV_HOST_SIMD_INLINE void softcap_body(float* z, int64_t n, float c, float inv) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) z[i] = c * kv_tanh(z[i] * inv);
}

KV_HOST_SIMD_VARIANTS(softcap, (float* z, int64_t n, float c, float inv), (z, n, c, inv))

}  // namespace

void softcap_f32_(float* z, int64_t n, double cap) {
    const float c = float(cap), inv = float(1.0 / cap);
    const int64_t blk = 16384, blocks = (n + blk - 1) / blk;
#pragma omp parallel for schedule(static) if (blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) softcap_any(z + b * blk, std::min(blk, n - b * blk), c, inv);
}

}  // namespace kv
