// The final logit soft-cap z -> c tanh(z / c) (Gemma 2, Gemma 3n) on f32 logits in place:
// tanh in f32 plain arithmetic (a few ulp; kernels/common/element_math.h), vectorised per ISA
// level (host_simd.h), in parallel over blocks.
#pragma once

#include <cstdint>

namespace kv {

void softcap_f32_(float* z, int64_t n, double cap);

}  // namespace kv
