// Small-M products that stream a weight matrix once (decode: M = 1..4 tokens), used by the
// matmul small-M path and the SDPA decode path (scores = query rows . key rows). GCC vector
// extensions as in gemm_tile.h: 64-byte vectors are zmm registers on AVX-512, pairs of ymm
// (or plain SSE) elsewhere, so one source serves every ISA level (kernels/CMakeLists.txt
// compiles it once per level); they pass between functions only by reference. Weights are f32 or bf16 (uint16_t bits, widened exactly by a 16-bit shift, the same
// conversion as bf16_to_f32 in kernels/common/dtype.h); accumulation is f32.
// Two layouts of W:
//   dot:  y[m, r] = sum_k x[m, k] w[r, k]    w rows contiguous (PyTorch Linear [out, in], keys)
//   axpy: y[m, c] = sum_k x[m, k] w[k, c]    w rows contiguous over the output columns c
// These kernels must stay plain arithmetic: no allocation, no threads (callers split N).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KV_GEMV_DOT_BF16 1  // the vdpbf16ps kernel below is compiled (used when the CPU has it)
#else
#define KV_GEMV_DOT_BF16 0
#endif

#include "gemm_tile.h"
#include "kernels/common/dtype.h"

namespace kv::cpu {

typedef float vf32x4 __attribute__((vector_size(16)));
typedef uint16_t vu16x16 __attribute__((vector_size(32)));
typedef uint32_t vu32x16 __attribute__((vector_size(64)));

// 16 consecutive weights as f32.
inline void load16(vf32x16& f, const float* p) { vload(f, p); }
inline void load16(vf32x16& f, const uint16_t* p) {
    vu16x16 h;
    std::memcpy(&h, p, sizeof(h));
    const vu32x16 u = __builtin_convertvector(h, vu32x16) << 16;
    std::memcpy(&f, &u, sizeof(f));
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) { return bf16_to_f32(*p); }

// Horizontal sums of four vectors: {sum a, sum b, sum c, sum d} (a tree of shuffles: ~3
// instructions per sum instead of ~8 for four separate reductions).
inline vf32x4 hsum4(const vf32x16& a, const vf32x16& b, const vf32x16& c, const vf32x16& d) {
    const vf32x16 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                       __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const vf32x16 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                       __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    // [a8 | b8] [c8 | d8] -> [a4 | b4 | c4 | d4]
    vf32x16 t = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
                __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    t += __builtin_shufflevector(t, t, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    t += __builtin_shufflevector(t, t, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return __builtin_shufflevector(t, t, 0, 4, 8, 12);
}

inline float hsum(const vf32x16& a) {
    const vf32x16 z{};
    return hsum4(a, z, z, z)[0];
}

// One W row at a time: rows are read front to back as one address stream, which the hardware
// prefetchers follow; interleaving four short rows (1-2 KiB each) ran at half the bandwidth
// (kernels/lab/gemv_lab.cpp v2). U independent accumulators per x row hide the FMA latency.
// A software prefetch into L2 (prefetcht1, locality 2) kPrefetchBytes ahead gained 10-20% on
// weight rows; into L1 (t0) or non-temporal it lost ~20% against none (the lab's
// measurements). Short rows (SDPA keys, <= kShortRowBytes) go without: there it cost ~20%
// of the score pass.
// y[m * ldy] = sum_{k < K} x[m * ldx + k] * w[k]   (m < M)
constexpr int64_t kPrefetchBytes = 2048;
constexpr int kPrefetchLocality = 2;  // prefetcht1
constexpr int64_t kShortRowBytes = 512;
template <class W, int M>
inline void gemv_dot_row(int64_t K, const float* x, int64_t ldx, const W* w, float* y, int64_t ldy) {
    constexpr int U = M >= 4 ? 1 : M >= 2 ? 2 : 4;
    vf32x16 acc[M][U];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int u = 0; u < U; ++u) acc[m][u] = vf32x16{};
    const bool prefetch = K * int64_t(sizeof(W)) > kShortRowBytes;
    int64_t k = 0;
    for (; k + 16 * U <= K; k += 16 * U) {
        vf32x16 wv[U];
#pragma GCC unroll 16
        for (int u = 0; u < U; ++u) {
            if (prefetch && (16 * u * sizeof(W)) % 64 == 0)
                __builtin_prefetch(reinterpret_cast<const char*>(w + k + 16 * u) + kPrefetchBytes, 0, kPrefetchLocality);
            load16(wv[u], w + k + 16 * u);
        }
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
            for (int u = 0; u < U; ++u) {
                vf32x16 xv;
                vload(xv, x + m * ldx + k + 16 * u);
                acc[m][u] += xv * wv[u];
            }
    }
    for (; k + 16 <= K; k += 16) {
        vf32x16 wv;
        load16(wv, w + k);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
            vf32x16 xv;
            vload(xv, x + m * ldx + k);
            acc[m][0] += xv * wv;
        }
    }
    float s[M];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
        vf32x16 t = acc[m][0];
#pragma GCC unroll 16
        for (int u = 1; u < U; ++u) t += acc[m][u];
        s[m] = hsum(t);
    }
    for (; k < K; ++k)  // K tail (K % 16)
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
// Compiled for the target by attribute, chosen at run time (cpu_has_dot_bf16), so builds
// without -march=native keep the generic path.
inline bool cpu_has_dot_bf16() {
    static const bool ok = [] {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    }();
    return ok;
}

template <int M>
__attribute__((target("avx512f,avx512bf16"))) inline void gemv_dot_row_bf16(int64_t K, const uint16_t* x, int64_t ldx,
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
        const vf32x16 tv = (vf32x16)t;
        float sm = hsum(tv);
        for (int64_t kk = k; kk < K; ++kk) sm += bf16_to_f32(x[m * ldx + kk]) * bf16_to_f32(w[kk]);  // K tail (K % 32)
        y[m * ldy] = sm;
    }
}

template <int M>
__attribute__((target("avx512f,avx512bf16"))) void gemv_dot_rows_bf16(int64_t n, int64_t K, const uint16_t* x, int64_t ldx,
                                                                      const uint16_t* w, int64_t ldw, float* y, int64_t ldy) {
    for (int64_t r = 0; r < n; ++r) gemv_dot_row_bf16<M>(K, x, ldx, w + r * ldw, y + r, ldy);
}

// Runtime M (1..4); call only when cpu_has_dot_bf16().
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

// y[m * ldy + v * 16 + i] = sum_{k < K} x[m * ldx + k] * w[k * ldw + v * 16 + i]  (NV vectors of columns)
template <class W, int M, int NV>
inline void gemv_axpy_tile(int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    vf32x16 acc[M][NV];
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) acc[m][v] = vf32x16{};
    for (int64_t k = 0; k < K; ++k) {
        vf32x16 wv[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) load16(wv[v], w + k * ldw + v * 16);
#pragma GCC unroll 16
        for (int m = 0; m < M; ++m) {
            const float xs = x[m * ldx + k];
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) acc[m][v] += xs * wv[v];
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m)
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vstore(y + m * ldy + v * 16, acc[m][v]);
}

// Axpy layout over columns [0, n) of W.
template <class W, int M>
inline void gemv_axpy_cols(int64_t n, int64_t K, const float* x, int64_t ldx, const W* w, int64_t ldw, float* y, int64_t ldy) {
    int64_t c = 0;
    for (; c + 64 <= n; c += 64) gemv_axpy_tile<W, M, 4>(K, x, ldx, w + c, ldw, y + c, ldy);
    for (; c + 16 <= n; c += 16) gemv_axpy_tile<W, M, 1>(K, x, ldx, w + c, ldw, y + c, ldy);
    if (c < n) {  // column tail (n % 16): plain loops
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
