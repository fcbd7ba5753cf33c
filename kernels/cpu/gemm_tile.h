// Register-blocked products for attention-sized operands (K = head size or a key block),
// used by the SDPA forward and backward. GCC vector extensions of the ISA level's register
// width (zmm, ymm or xmm; kernels/CMakeLists.txt compiles this once per level), so there is
// one source for every target. Vectors pass between functions only by reference: a vector
// argument's calling convention depends on the ISA flags (GCC's -Wpsabi).
// C (m x n) = or += A (m x k) . B (k x n) with n a multiple of the vector width (callers pad).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace kv::cpu {

// The widest vector this ISA level has registers for: 64 bytes (zmm) with AVX-512, 32 (ymm)
// with AVX2, 16 (xmm) otherwise. A GCC vector wider than the registers is not a register
// type: GCC keeps it in memory and moves every operation through the stack (64-byte vectors
// on AVX2 made the SDPA products ~2x slower than plain loops, measured in the lab).
#if defined(__AVX512F__)
#define KV_VEC_BYTES 64
#elif defined(__AVX__)
#define KV_VEC_BYTES 32
#else
#define KV_VEC_BYTES 16
#endif
typedef float vf32 __attribute__((vector_size(KV_VEC_BYTES)));
typedef double vf64 __attribute__((vector_size(KV_VEC_BYTES)));

template <class A>
struct vec_of;
template <>
struct vec_of<float> {
    using type = vf32;
};
template <>
struct vec_of<double> {
    using type = vf64;
};
template <class A>
using vec = typename vec_of<A>::type;

// Elements per vector: 16/8/4 floats or 8/4/2 doubles. Callers pad n to a multiple of 16
// floats, which every width divides.
template <class A>
constexpr int64_t vec_width() {
    return int64_t(KV_VEC_BYTES / sizeof(A));
}

// Accumulator tile: MR rows x NV vectors. With 32 vector registers (AVX-512) 8 x 2 keeps 16
// accumulators, 2 B vectors and a broadcast in registers and measured fastest in the lab
// (kernels/lab/sdpa_lab.cpp; 4 x 4 loses ~20% to its B reloads). 16-register targets (AVX2)
// use 6 x 2: 12 accumulators, 2 B vectors and a broadcast fill 15 registers, and 12 independent
// FMA chains cover two FMA pipes of 4-6 cycles' latency where 4 x 2's 8 did not (AMD EPYC Zen 3,
// kvlab_lab_sdpa at one thread, SmolLM2's 1024-token prefill: forward 24 -> 29-33 GFLOP/s,
// backward 19-25 -> 33-35).
#if defined(__AVX512F__)
constexpr int kTileMR = 8;
constexpr int kTileNV = 2;
#else
constexpr int kTileMR = 6;
constexpr int kTileNV = 2;
#endif

// acc += a * b, fused into one rounding where the ISA level has FMA. Everything is compiled
// with -ffp-contract=off (CMakeLists.txt), so no other expression is fused behind the
// formulas' back: element-wise ops and quantization give the same bits at every ISA level
// (Q4_0's x / d + 8.5 once rounded differently with a contracted FMA), and the products'
// inner loops ask for FMA here, explicitly.
inline void fma_acc(vf32& acc, const vf32& a, const vf32& b) {
#if KV_VEC_BYTES == 64
    acc = (vf32)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif KV_VEC_BYTES == 32 && defined(__FMA__)
    acc = (vf32)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    acc += a * b;
#endif
}
inline void fma_acc(vf64& acc, const vf64& a, const vf64& b) {
#if KV_VEC_BYTES == 64
    acc = (vf64)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)acc);
#elif KV_VEC_BYTES == 32 && defined(__FMA__)
    acc = (vf64)_mm256_fmadd_pd((__m256d)a, (__m256d)b, (__m256d)acc);
#else
    acc += a * b;
#endif
}

template <class A>
inline void vload(vec<A>& v, const A* p) {
    std::memcpy(&v, p, sizeof(v));
}

template <class A>
inline void vstore(A* p, const vec<A>& v) {
    std::memcpy(p, &v, sizeof(v));
}

// One MR x NV tile: A element (r, kk) = a[r * ars + kk * aks] (broadcast; either layout of A
// works, so A^T products need no transposed copy), B row kk = b + kk * ldb (vectors).
template <class A, int MR, int NV>
inline void gemm_tile(int64_t k, const A* a, int64_t ars, int64_t aks, const A* b, int64_t ldb, A* c, int64_t ldc, bool acc) {
    constexpr int64_t W = vec_width<A>();
    vec<A> t[MR][NV];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
            if (acc) vload(t[r][v], c + r * ldc + v * W);
            else t[r][v] = vec<A>{};
        }
    for (int64_t kk = 0; kk < k; ++kk) {
        vec<A> bv[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vload(bv[v], b + kk * ldb + v * W);
#pragma GCC unroll 16
        for (int r = 0; r < MR; ++r) {
            const vec<A> s = vec<A>{} + a[r * ars + kk * aks];  // broadcast
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) fma_acc(t[r][v], s, bv[v]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * W, t[r][v]);
}

template <class A, int MR>
inline void gemm_rows(int64_t n, int64_t k, const A* a, int64_t ars, int64_t aks, const A* b, int64_t ldb, A* c, int64_t ldc, bool acc) {
    constexpr int64_t W = vec_width<A>();
    int64_t col = 0;
    for (; col + kTileNV * W <= n; col += kTileNV * W) gemm_tile<A, MR, kTileNV>(k, a, ars, aks, b + col, ldb, c + col, ldc, acc);
    for (; col + W <= n; col += W) gemm_tile<A, MR, 1>(k, a, ars, aks, b + col, ldb, c + col, ldc, acc);
}

template <class A, int MR>
inline void gemm_rows_tail(int64_t rem, int64_t n, int64_t k, const A* a, int64_t ars, int64_t aks, const A* b, int64_t ldb, A* c,
                           int64_t ldc, bool acc) {
    if constexpr (MR > 0) {
        if (rem == MR) gemm_rows<A, MR>(n, k, a, ars, aks, b, ldb, c, ldc, acc);
        else gemm_rows_tail<A, MR - 1>(rem, n, k, a, ars, aks, b, ldb, c, ldc, acc);
    }
}

// C (m x n, row stride ldc) = (acc ? C : 0) + A . B;  n % vec_width<A>() == 0.
template <class A>
inline void gemm_bcast(int64_t m, int64_t n, int64_t k, const A* a, int64_t ars, int64_t aks, const A* b, int64_t ldb, A* c,
                       int64_t ldc, bool acc) {
    int64_t r = 0;
    for (; r + kTileMR <= m; r += kTileMR) gemm_rows<A, kTileMR>(n, k, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc, acc);
    if (r < m) gemm_rows_tail<A, kTileMR - 1>(m - r, n, k, a + r * ars, ars, aks, b, ldb, c + r * ldc, ldc, acc);
}

}  // namespace kv::cpu
