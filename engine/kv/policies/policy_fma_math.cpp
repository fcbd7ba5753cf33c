// Fused products and the tile softmax (see policy_fma_math.h). The bodies
// (policy_fma_math_body.inc) are compiled three times, each inside a `#pragma GCC target` region
// of its ISA level, so the FMA intrinsics they call are inlined at that level; the CPU picks one
// once (policy_matmul_level: KVLAB_CPU_VARIANT caps it, so tests reach every path).
#include "engine/kv/policies/policy_fma_math.h"

#include <algorithm>
#include <cstring>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kv {

namespace {
typedef int i32x4 __attribute__((vector_size(16)));
typedef int i32x8 __attribute__((vector_size(32)));
typedef int i32x16 __attribute__((vector_size(64)));
}  // namespace

namespace fma_v2 {
#define KV_FMA_LEVEL 2
#include "engine/kv/policies/policy_fma_math_body.inc"
#undef KV_FMA_LEVEL
}  // namespace fma_v2

#if defined(__x86_64__)
// The regions add the level's features to the unit's own target rather than naming an arch: a
// unit built for a wider CPU (the sanitizer's AVX-512 object, -march=native) would otherwise
// lose features its intrinsics carry, and GCC refuses to inline them ("target specific option
// mismatch"). Where the unit already has AVX-512, level 3 may then use it too: such a build
// needs an AVX-512 CPU anyway, and the explicit FMA chains give the same bits.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace fma_v3 {
#define KV_FMA_LEVEL 3
#include "engine/kv/policies/policy_fma_math_body.inc"
#undef KV_FMA_LEVEL
}  // namespace fma_v3
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512vl,avx512bw,avx512dq,avx512cd")
namespace fma_v4 {
#define KV_FMA_LEVEL 4
#include "engine/kv/policies/policy_fma_math_body.inc"
#undef KV_FMA_LEVEL
}  // namespace fma_v4
#pragma GCC pop_options
#endif

namespace {
int level_for(int level) { return std::min(level, policy_matmul_level()); }
}  // namespace

void policy_matmul_fma_at(int level, int64_t m, int64_t n, int64_t k, const float* A, int64_t sar, int64_t sad, const float* B, int64_t ldb,
                          float* C, int64_t ldc, bool acc) {
#if defined(__x86_64__)
    level = level_for(level);
    if (level >= 4) return fma_v4::matmul<fma_v4::VF, float>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
    if (level >= 3) return fma_v3::matmul<fma_v3::VF, float>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
#endif
    fma_v2::matmul<fma_v2::VF, float>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
}
void policy_matmul_fma_at(int level, int64_t m, int64_t n, int64_t k, const double* A, int64_t sar, int64_t sad, const double* B,
                          int64_t ldb, double* C, int64_t ldc, bool acc) {
#if defined(__x86_64__)
    level = level_for(level);
    if (level >= 4) return fma_v4::matmul<fma_v4::VD, double>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
    if (level >= 3) return fma_v3::matmul<fma_v3::VD, double>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
#endif
    fma_v2::matmul<fma_v2::VD, double>(m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
}
void policy_matmul_fma(int64_t m, int64_t n, int64_t k, const float* A, int64_t sar, int64_t sad, const float* B, int64_t ldb, float* C,
                       int64_t ldc, bool acc) {
    policy_matmul_fma_at(4, m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
}
void policy_matmul_fma(int64_t m, int64_t n, int64_t k, const double* A, int64_t sar, int64_t sad, const double* B, int64_t ldb, double* C,
                       int64_t ldc, bool acc) {
    policy_matmul_fma_at(4, m, n, k, A, sar, sad, B, ldb, C, ldc, acc);
}

void policy_tile_softmax_colsum_at(int level, float* S, int64_t m, int64_t n, int64_t lds, const uint8_t* use, double R, double* A,
                                   float* w) {
#if defined(__x86_64__)
    level = level_for(level);
    if (level >= 4) return fma_v4::softmax_colsum(S, m, n, lds, use, R, A, w);
    if (level >= 3) return fma_v3::softmax_colsum(S, m, n, lds, use, R, A, w);
#endif
    fma_v2::softmax_colsum(S, m, n, lds, use, R, A, w);
}
void policy_tile_softmax_colsum(float* S, int64_t m, int64_t n, int64_t lds, const uint8_t* use, double R, double* A, float* w) {
    policy_tile_softmax_colsum_at(4, S, m, n, lds, use, R, A, w);
}

void policy_tile_attention_colsum_at(int level, const float* Q, int64_t ldq, const float* Kt, int64_t ldk, int64_t m, int64_t n, int64_t D,
                                     const uint8_t* use, double R, double* A, float* S, double* acc) {
#if defined(__x86_64__)
    level = level_for(level);
    if (level >= 4) return fma_v4::attention_colsum(Q, ldq, Kt, ldk, m, n, D, use, R, A, S, acc);
    if (level >= 3) return fma_v3::attention_colsum(Q, ldq, Kt, ldk, m, n, D, use, R, A, S, acc);
#endif
    fma_v2::attention_colsum(Q, ldq, Kt, ldk, m, n, D, use, R, A, S, acc);
}
void policy_tile_attention_colsum(const float* Q, int64_t ldq, const float* Kt, int64_t ldk, int64_t m, int64_t n, int64_t D, const uint8_t* use,
                                  double R, double* A, float* S, double* acc) {
    policy_tile_attention_colsum_at(4, Q, ldq, Kt, ldk, m, n, D, use, R, A, S, acc);
}

}  // namespace kv
