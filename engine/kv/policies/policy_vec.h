// GCC vector types and the inlining rule shared by the policies' per-ISA-level kernels
// (policy_math.cpp, policy_expected_attention_math.cpp). Each vector type is used only inside a
// function built for its level (target attributes), never passed between functions: a vector
// argument's ABI depends on the ISA flags.
#pragma once

namespace kv {

typedef float f32x2 __attribute__((vector_size(8)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef double f64x2 __attribute__((vector_size(16)));
typedef double f64x4 __attribute__((vector_size(32)));
typedef double f64x8 __attribute__((vector_size(64)));

}  // namespace kv

// Local arrays of vectors and the lane arrays read from them are declared KV_VEC_LOCAL. Compiling
// a whole unit with AVX-512 (-march=native on such a CPU, any tuning), GCC 12 raises the
// alignment of some of them to 64 bytes on its own (a 64-byte `VD ql[1][4] = {}`) and writes
// them with aligned 64-byte moves. The real stack is realigned for that, but AddressSanitizer's
// fake stack (detect_stack_use_after_return) lays a frame out with only the declared alignments
// (at least 32), so such an array can sit at 32 mod 64 and the move faults (issue 45). Declared,
// the alignment holds in every frame; in registers it costs nothing.
#define KV_VEC_LOCAL alignas(64)

// always_inline puts a body into each target-specific caller (compiled for that ISA); ASan
// builds refuse always_inline across target attributes, so there it is a plain inline (slower,
// same math).
#if defined(__SANITIZE_ADDRESS__)
#define KV_POLICY_VEC_INLINE inline
#else
#define KV_POLICY_VEC_INLINE __attribute__((always_inline)) inline
#endif
