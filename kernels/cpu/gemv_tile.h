// Small-M products that stream a weight matrix once (decode: M = 1..4 tokens), used by the
// matmul small-M path and the SDPA decode path (scores = query rows . key rows). GCC vector
// extensions of the ISA level's register width (gemm_tile.h: kW = 16, 8 or 4 floats), so one
// source serves every level (kernels/CMakeLists.txt compiles it once per level); vectors pass
// between functions only by reference. Weights are f32 or bf16 (uint16_t bits, widened
// exactly by a 16-bit shift, the same conversion as bf16_to_f32 in kernels/common/dtype.h);
// accumulation is f32.
// Two layouts of W:
//   dot:  y[m, r] = sum_k x[m, k] w[r, k]    w rows contiguous (PyTorch Linear [out, in], keys)
//   axpy: y[m, c] = sum_k x[m, k] w[k, c]    w rows contiguous over the output columns c
// These kernels must stay plain arithmetic: no allocation, no threads (callers split N).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512BF16__)
#include <immintrin.h>
#define KV_GEMV_DOT_BF16 1  // the vdpbf16ps kernel below (the avx512bf16 variant, or a native build on such a CPU)
#else
#define KV_GEMV_DOT_BF16 0
#endif

#include "gemm_tile.h"
#include "kernels/common/dtype.h"

namespace kv::cpu {

constexpr int kW = int(vec_width<float>());  // floats per vector
typedef uint16_t vu16 __attribute__((vector_size(KV_VEC_BYTES / 2)));
typedef uint32_t vu32 __attribute__((vector_size(KV_VEC_BYTES)));

// kW consecutive weights as f32.
inline void loadw(vf32& f, const float* p) { vload(f, p); }
inline void loadw(vf32& f, const uint16_t* p) {
    vu16 h;
    std::memcpy(&h, p, sizeof(h));
    const vu32 u = __builtin_convertvector(h, vu32) << 16;
    std::memcpy(&f, &u, sizeof(f));
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_f32(*p); }

// Horizontal sum as a halving tree (lane i + lane i + w/2, ...), in shuffles: the same order
// at every width for the lanes it has. Called once per W row, so it matters for short rows
// (SDPA decode: one 64-float key row per call).
typedef float vf32x4 __attribute__((vector_size(16)));
inline float hsum(const vf32& a) {
#if KV_VEC_BYTES == 64
    typedef float vf32x8 __attribute__((vector_size(32)));
    const vf32x8 h8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    vf32x4 t = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
#elif KV_VEC_BYTES == 32
    vf32x4 t = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
#else
    vf32x4 t = a;
#endif
    t += __builtin_shufflevector(t, t, 2, 3, 0, 1);
    t += __builtin_shufflevector(t, t, 1, 0, 3, 2);
    return t[0];
}

// One W row at a time: rows are read front to back as one address stream, which the hardware
// prefetchers follow; interleaving four short rows (1-2 KiB each) ran at half the bandwidth
// (kernels/lab/gemv_lab.cpp v2). U independent accumulators per x row hide the FMA latency:
// 64 floats in flight for one row, fewer per row for more rows, at most 8 accumulators on
// 16-register ISA levels.
// A software prefetch into L2 (prefetcht1, locality 2) kPrefetchBytes ahead gained 10-20% on
// weight rows; into L1 (t0) or non-temporal it lost ~20% against none (the lab's
// measurements). Rows up to kShortRowBytes go without. It was 512 (every SDPA key row of 64
// f32 went without: the lab once measured ~20% lost on the score pass); SmolLM2 decode's SDPA
// over ~600 keys, f32 rows of 256 bytes, then took 127-138 us per layer without the prefetch
// and 118-125 us with it at one thread, 81-121 against 80-98 us at two (paired runs, idle
// cores, 2026-11-26), so 256-byte rows are prefetched now; bf16 rows of 64 (128 bytes) still
// go without.
// Without AVX-512 the prefetch is issued for bf16 rows only: on the AVX2 machine measured (a
// 2-vCPU AMD EPYC, kvlab_lab_gemv, M = 1, eight model shapes, each interleaved with a plain
// read) f32 rows ran at 0.73-0.84x of the read with it and 0.76-1.00x without, bf16 rows at
// 0.73-0.86x with it and 0.51-0.72x without (widening bf16 leaves the core less slack to
// issue the hardware prefetcher's demand misses early). The AVX-512 machine gained on both.
// y[m * ldy] = sum_{k < K} x[m * ldx + k] * w[k]   (m < M)
template <class W>
constexpr bool prefetch_rows() {
#if defined(__AVX512F__)
    return true;
#else
    return sizeof(W) == 2;
#endif
}
constexpr int64_t kPrefetchBytes = 2048;
constexpr int kPrefetchLocality = 2;  // prefetcht1
constexpr int64_t kShortRowBytes = 128;
template <int M>
constexpr int dot_unroll() {
    constexpr int u16 = M >= 4 ? 1 : M >= 2 ? 2 : 4;  // in 16-float steps (the AVX-512 choice)
    constexpr int u = u16 * 16 / kW;
    constexpr int cap = kW == 16 ? 16 : (8 / M > 0 ? 8 / M : 1);
    return u < cap ? u : cap;
}
template <class W, int M>
inline void gemv_dot_row(int64_t K, const float* x, int64_t ldx, const W* w, float* y, int64_t ldy) {
    constexpr int U = dot_unroll<M>();
    vf32 acc[M][U];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int u = 0; u < U; ++u) acc[m][u] = vf32{};
    const bool prefetch = prefetch_rows<W>() && K * int64_t(sizeof(W)) > kShortRowBytes;
    int64_t k = 0;
    for (; k + kW * U <= K; k += kW * U) {
        vf32 wv[U];
#pragma GCC unroll 16
        for (int u = 0; u < U; ++u) {
            if (prefetch && (kW * u * sizeof(W)) % 64 == 0)
                __builtin_prefetch(reinterpret_cast<const char*>(w + k + kW * u) + kPrefetchBytes, 0, kPrefetchLocality);
            loadw(wv[u], w + k + kW * u);
        }
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
            for (int u = 0; u < U; ++u) {
                vf32 xv;
                vload(xv, x + m * ldx + k + kW * u);
                fma_acc(acc[m][u], xv, wv[u]);
            }
    }
    for (; k + kW <= K; k += kW) {
        vf32 wv;
        loadw(wv, w + k);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
            vf32 xv;
            vload(xv, x + m * ldx + k);
            fma_acc(acc[m][0], xv, wv);
        }
    }
    float s[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
        vf32 t = acc[m][0];
#pragma GCC unroll 16
        for (int u = 1; u < U; ++u) t += acc[m][u];
        s[m] = hsum(t);
    }
    for (; k < K; ++k)  // K tail (K % kW)
        for (int m = 0; m < M; ++m) s[m] += x[m * ldx + k] * load1(w + k);
    for (int m = 0; m < M; ++m) y[m * ldy] = s[m];
}

// Dot layout over rows [0, n) of W: y[m * ldy + r] for r < n.
template <class W, int M>
inline void gemv_dot_rows(int64_t n, int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    for (int64_t r = 0; r < n; ++r) gemv_dot_row<W, M>(K, x, ldx, w + r * ldw, y + r, ldy);
}

// Runtime M (1..4) -> template.
template <class W>
inline void gemv_dot(int M, int64_t n, int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    switch (M) {
        case 1: gemv_dot_rows<W, 1>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 2: gemv_dot_rows<W, 2>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 3: gemv_dot_rows<W, 3>(n, K, x, ldx, w, ldw, y, ldy); break;
        default: gemv_dot_rows<W, 4>(n, K, x, ldx, w, ldw, y, ldy); break;
    }
}

#if KV_GEMV_DOT_BF16
// ---- bf16 x bf16 dot layout through AVX512-BF16 (vdpbf16ps) ------------------------------
// When x and W are both bf16 (bf16 models), vdpbf16ps multiplies 32 pairs per instruction
// and adds each pair of exact products into an f32 lane (round to nearest even; denormal
// inputs and results flush to zero): half the instructions of widening W and FMAs, which
// matters when the other core's load leaves these streaming kernels short of CPU time.
// Compiled only where the ISA level has AVX512-BF16 (the avx512bf16 variant, which is loaded
// only on CPUs that have it), so a forced lower variant never executes it.

template <int M>
inline void gemv_dot_row_bf16(int64_t K, const uint16_t* x, int64_t ldx,
                                                                            const uint16_t* w, float* y, int64_t ldy) {
    constexpr int U = M >= 3 ? 1 : M == 2 ? 2 : 4;
    __m512 acc[M][U];
    for (int m = 0; m < M; ++m)
        for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 * U <= K; k += 32 * U) {
        for (int u = 0; u < U; ++u) {
            __builtin_prefetch(reinterpret_cast<const char*>(w + k + 32 * u) + kPrefetchBytes, 0, kPrefetchLocality);
            const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k + 32 * u);
            for (int m = 0; m < M; ++m) acc[m][u] = _mm512_dpbf16_ps(acc[m][u], (__m512bh)_mm512_loadu_si512(x + m * ldx + k + 32 * u), wv);
        }
    }
    for (; k + 32 <= K; k += 32) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(w + k);
        for (int m = 0; m < M; ++m) acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(x + m * ldx + k), wv);
    }
    for (int m = 0; m < M; ++m) {
        __m512 t = acc[m][0];
        for (int u = 1; u < U; ++u) t = _mm512_add_ps(t, acc[m][u]);
        const vf32 tv = (vf32)t;  // 64-byte vectors here (AVX512-BF16 implies AVX-512)
        float sm = hsum(tv);
        for (int64_t kk = k; kk < K; ++kk) sm += bf16_to_f32(x[m * ldx + kk]) * bf16_to_f32(w[kk]);  // K tail (K % 32)
        y[m * ldy] = sm;
    }
}

template <int M>
void gemv_dot_rows_bf16(int64_t n, int64_t K, const uint16_t* x, int64_t ldx,
                                                                      const uint16_t* w, int64_t ldw, float* y, int64_t ldy) {
    for (int64_t r = 0; r < n; ++r) gemv_dot_row_bf16<M>(K, x, ldx, w + r * ldw, y + r, ldy);
}

// Runtime M (1..4).
inline void gemv_dot_bf16(int M, int64_t n, int64_t K, const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t ldw, float* y,
                          int64_t ldy) {
    switch (M) {
        case 1: gemv_dot_rows_bf16<1>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 2: gemv_dot_rows_bf16<2>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 3: gemv_dot_rows_bf16<3>(n, K, x, ldx, w, ldw, y, ldy); break;
        default: gemv_dot_rows_bf16<4>(n, K, x, ldx, w, ldw, y, ldy); break;
    }
}
#endif

// y[m * ldy + v * kW + i] = sum_{k < K} x[m * ldx + k] * w[k * ldw + v * kW + i]  (NV vectors of columns)
template <class W, int M, int NV>
inline void gemv_axpy_tile(int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    vf32 acc[M][NV];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[m][v] = vf32{};
    for (int64_t k = 0; k < K; ++k) {
        vf32 wv[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) loadw(wv[v], w + k * ldw + v * kW);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
            const vf32 xs = vf32{} + x[m * ldx + k];  // broadcast
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) fma_acc(acc[m][v], xs, wv[v]);
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vstore(y + m * ldy + v * kW, acc[m][v]);
}

// Columns per main tile: 4 vectors (64 columns on AVX-512, M x 4 of its 32 registers); on
// 16-register levels 2 vectors for M >= 3 so the accumulators and weights stay in registers.
template <int M>
constexpr int axpy_vectors() {
    return kW == 16 || M < 3 ? 4 : 2;
}

// Axpy layout over columns [0, n) of W.
template <class W, int M>
inline void gemv_axpy_cols(int64_t n, int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    constexpr int NV = axpy_vectors<M>();
    int64_t c = 0;
    for (; c + NV * kW <= n; c += NV * kW) gemv_axpy_tile<W, M, NV>(K, x, ldx, w + c, ldw, y + c, ldy);
    for (; c + kW <= n; c += kW) gemv_axpy_tile<W, M, 1>(K, x, ldx, w + c, ldw, y + c, ldy);
    if (c < n) {  // column tail (n % kW): plain loops
        for (int m = 0; m < M; ++m)
            for (int64_t j = c; j < n; ++j) y[m * ldy + j] = 0;
        for (int64_t k = 0; k < K; ++k)
            for (int m = 0; m < M; ++m) {
                const float xs = x[m * ldx + k];
                for (int64_t j = c; j < n; ++j) y[m * ldy + j] += xs * load1(w + k * ldw + j);
            }
    }
}

template <class W>
inline void gemv_axpy(int M, int64_t n, int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    switch (M) {
        case 1: gemv_axpy_cols<W, 1>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 2: gemv_axpy_cols<W, 2>(n, K, x, ldx, w, ldw, y, ldy); break;
        case 3: gemv_axpy_cols<W, 3>(n, K, x, ldx, w, ldw, y, ldy); break;
        default: gemv_axpy_cols<W, 4>(n, K, x, ldx, w, ldw, y, ldy); break;
    }
}

}  // namespace kv::cpu
