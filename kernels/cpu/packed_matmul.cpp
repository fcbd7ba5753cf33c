// MATMUL with a packed weight (op.h): the weight stays in its ggml block format
// (kernels/common/packed_blocks.h) and is dequantized where it is used, never as a whole.
//   Decode (M <= kPackedSmallM rows): each weight row is streamed once. Q8_0, Q4_0, Q4_1,
//     Q5_0, Q5_1, F16 and BF16 on AVX2/AVX-512 are widened in registers, 4 rows per pass
//     (gemv_rows_simd), the k-quants Q4_K, Q5_K, Q6_K too (gemv_kquant), the avx2 variant's
//     Q4_1_R16 8 rows per vector (gemv_r16); NF4 (and every format on the base variant) turns
//     each block into its floats in an L1-resident buffer by the loader's own block function and
//     multiplies them into f32 vector accumulators (gemv_tile.h's vectors, one width per variant).
//   Prefill (more rows): panels of weight rows are dequantized into a per-thread f32 panel
//     and multiplied by the f32 matmul path (oneDNN) with one thread per panel; the panels'
//     columns of the output are disjoint, so no reduction is needed. Up to kLargePanelM rows
//     of x a panel fits L2 (kPanelBytes); from there on each thread takes one panel of up to
//     kLargePanelBytes, because every oneDNN call packs all of x again: SmolLM2's 2048-token
//     prefill called it ~20 times per matrix with 80-row panels.
//   Transposed (p.axis = 1, gradients w.r.t. activations): dst = x @ W, panel by panel of
//     weight rows, accumulating into dst through the f32 matmul path (multi-threaded there).
//   Q4_1 regrouped by 16 rows (Q4_1_R16, where the backend prefers it: AVX2) has its own
//     decode GEMV below, a column of 8 rows per vector.
// Every weight value used equals the dequantize-at-load value bit for bit (this file is
// compiled with -ffp-contract=off, like the loader); only the summation order differs. The one
// exception is Q4_1_R16's decode GEMV, which factors d and m out of each block's dot product.
#include <omp.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#if defined(__AVX512F__)
// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

#include "cpu_common.h"
#include "gemv_tile.h"
#include "kernels/common/packed_blocks.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

// Decode rows up to this many tokens stream the packed rows (gemv); more go through panels.
// Measured with `kvlab bench model` (docs/PERFORMANCE.md): at M = 4 the streaming kernel still
// reads each block once for all rows, while a panel costs a full dequantization per call.
constexpr int64_t kPackedSmallM = 4;
constexpr int64_t kChunkBytes = int64_t(32) << 10;     // packed bytes per decode work unit
// Below this, one thread. 128 KiB puts SmolLM2's o_proj (202 KiB of Q4_1) on both threads:
// 39 -> 25-31 us per call at 2 threads (helpers polling, idle cores, interleaved runs).
constexpr int64_t kParallelBytes = int64_t(128) << 10;
constexpr int64_t kPanelBytes = int64_t(192) << 10;    // f32 bytes of one prefill panel (L2)
constexpr int64_t kLargePanelM = 64;                   // rows of x from which a prefill panel is per thread
constexpr int64_t kLargePanelBytes = int64_t(16) << 20;  // f32 bytes of such a panel, at most

// NF4 (QLoRA's base) by a 16-entry table of level * absmax per block: the same single f32
// product as dequantize_block_nf4, bit for bit, where that shared function's switch per value
// ran decode at 0.04x of a plain read (kvlab_lab_packed_gemv, gate+up shape) and is also what
// every prefill panel of a QLoRA step dequantizes through. AVX-512 picks 16 values per vpermps
// and interleaves high (even) and low (odd) nibbles with vpermt2ps.
const std::array<float, 16> kNf4Levels = [] {
    std::array<float, 16> t{};
    for (int q = 0; q < 16; ++q) t[size_t(q)] = nf4_level(q);
    return t;
}();

inline void dequant_nf4(const uint8_t* b, float* y) {
    float amax;
    std::memcpy(&amax, b + 32, 4);
#if defined(__AVX512F__)
    const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(kNf4Levels.data()), _mm512_set1_ps(amax));
    const __m512i even = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i odd = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (int h = 0; h < 2; ++h) {  // bytes 16h .. 16h + 15: values 32h .. 32h + 31
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * h)));
        const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), t);                  // even values
        const __m512 lo = _mm512_permutexvar_ps(_mm512_and_si512(q, _mm512_set1_epi32(15)), t);  // odd values
        _mm512_storeu_ps(y + 32 * h, _mm512_permutex2var_ps(hi, even, lo));
        _mm512_storeu_ps(y + 32 * h + 16, _mm512_permutex2var_ps(hi, odd, lo));
    }
#elif defined(__AVX2__)
    // 8-lane permutes index 8 entries: both table halves are permuted, bit 3 picks one.
    const __m256 av = _mm256_set1_ps(amax);
    const __m256 t0 = _mm256_mul_ps(_mm256_loadu_ps(kNf4Levels.data()), av), t1 = _mm256_mul_ps(_mm256_loadu_ps(kNf4Levels.data() + 8), av);
    const __m256i seven = _mm256_set1_epi32(7), m15 = _mm256_set1_epi32(15);
    auto pick = [&](__m256i q) {
        return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t0, q), _mm256_permutevar8x32_ps(t1, q),
                                _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, seven)));
    };
    for (int h = 0; h < 4; ++h) {  // bytes 8h .. 8h + 7: values 16h .. 16h + 15
        const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8 * h)));
        const __m256 hi = pick(_mm256_srli_epi32(q, 4)), lo = pick(_mm256_and_si256(q, m15));
        const __m256 a = _mm256_unpacklo_ps(hi, lo), c = _mm256_unpackhi_ps(hi, lo);  // per 128-bit lane: h0 l0 h1 l1 | h2 l2 h3 l3
        _mm256_storeu_ps(y + 16 * h, _mm256_permute2f128_ps(a, c, 0x20));
        _mm256_storeu_ps(y + 16 * h + 8, _mm256_permute2f128_ps(a, c, 0x31));
    }
#else
    float t[16];
    for (int q = 0; q < 16; ++q) t[q] = kNf4Levels[size_t(q)] * amax;
    for (int i = 0; i < 32; ++i) {
        y[2 * i] = t[b[i] >> 4];
        y[2 * i + 1] = t[b[i] & 15];
    }
#endif
}

template <PackedFormat F>
inline void dequant(const uint8_t* b, float* y) {
    namespace B = gguf_blocks;
    if constexpr (F == PackedFormat::Q8_0) B::dequant_q8_0(b, y);
    else if constexpr (F == PackedFormat::Q4_0) B::dequant_q4_0(b, y);
    else if constexpr (F == PackedFormat::Q4_1) B::dequant_q4_1(b, y);
    else if constexpr (F == PackedFormat::Q5_0) B::dequant_q5_0(b, y);
    else if constexpr (F == PackedFormat::Q5_1) B::dequant_q5_1(b, y);
    else if constexpr (F == PackedFormat::Q4_K) B::dequant_q4_k(b, y);
    else if constexpr (F == PackedFormat::Q5_K) B::dequant_q5_k(b, y);
    else if constexpr (F == PackedFormat::NF4) dequant_nf4(b, y);
    else if constexpr (F == PackedFormat::F16) B::dequant_f16(b, y);
    else if constexpr (F == PackedFormat::BF16) B::dequant_bf16(b, y);
    else B::dequant_q6_k(b, y);
}

// y[m * ldy + r] = sum_k x[m * ldx + k] w_r[k] for rows r in [0, n) of packed W.
template <PackedFormat F, int M>
void gemv_packed_rows(int64_t n, int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, float* y,
                      int64_t ldy) {
    constexpr int BE = packed_block_elems(F), BB = packed_block_bytes(F), NV = BE / kW;
    alignas(64) float buf[BE];
    for (int64_t r = 0; r < n; ++r) {
        const uint8_t* wr = w + r * row_bytes;
        vf32 acc[M][2];
        for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = vf32{};
        for (int64_t b = 0; b < nblocks; ++b) {
            __builtin_prefetch(wr + (b + 8) * BB, 0, 2);
            const uint8_t* blk = wr + b * BB;
            // Q8_0 is widened in registers: w = d * q is the same single f32 multiply as the
            // block function's (bit-identical), without the round trip through `buf` that made
            // the generic form slower than f32 weights for this format.
            [[maybe_unused]] float d8 = 0;
            if constexpr (F == PackedFormat::Q8_0) d8 = f16_to_f32(uint16_t(blk[0] | (blk[1] << 8)));
            else dequant<F>(blk, buf);
            const float* xb = x + b * BE;
#pragma GCC unroll 16
            for (int v = 0; v < NV; ++v) {
                vf32 wv;
                if constexpr (F == PackedFormat::Q8_0) {
                    typedef int8_t vi8 __attribute__((vector_size(kW)));
                    vi8 q;
                    std::memcpy(&q, blk + 2 + v * kW, sizeof(q));
                    wv = __builtin_convertvector(q, vf32) * d8;
                } else {
                    vload(wv, buf + v * kW);
                }
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m) {
                    vf32 xv;
                    vload(xv, xb + m * ldx + v * kW);
                    fma_acc(acc[m][v & 1], xv, wv);
                }
            }
        }
        for (int m = 0; m < M; ++m) {
            const vf32 t = acc[m][0] + acc[m][1];
            y[m * ldy + r] = hsum(t);
        }
    }
}

// xs[m * nblocks + b] = sum of x's 32-element block b of row m: formed once per call by
// matmul_packed for the kernels that factor their blocks' dot products (Q4_1_R16, Q4_K, Q5_K).
void x_block_sums(int64_t M, int64_t nblocks, const float* x, int64_t ldx, float* xs) {
    static_assert(32 % kW == 0, "a block is whole vectors");
    for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < nblocks; ++b) {
            const float* xb = x + m * ldx + b * 32;
            vf32 t, u;
            vload(t, xb);
            for (int v = 1; v < 32 / kW; ++v) {
                vload(u, xb + v * kW);
                t += u;
            }
            xs[m * nblocks + b] = hsum(t);
        }
}

// ---- register-widened kernels for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16 and BF16 ------------------
// RB consecutive weight rows per pass (they are adjacent in memory: one address stream of
// RB * row_bytes), each x vector loaded once for all RB rows, every block widened in registers
// (no buffer). The weight values are the loader's bit for bit: Q8_0 d * float(q), Q4_0
// float(q - 8) * d, Q4_1 float(q) * d + m, each one f32 operation in that order (this file is
// compiled with -ffp-contract=off, so the mul and add of Q4_1 stay two roundings).
// AVX-512: the 16 possible values of a 4-bit block are built once per block (a 16-lane table,
// the same f32 operations on iota) and picked with vpermps, whose index is the low 4 bits of each
// 32-bit lane: the byte -> dword widening serves the low nibble as is, a shift gives the high.
// That is 1 widening + 1 shift + 2 permutes per 32 weights against 2 widenings, 2 masks,
// 2 conversions, 2 multiplies and 2 adds. AVX2 widens directly (8-lane permutes cannot index 16).
#if defined(__AVX512F__) || defined(__AVX2__)
#define KV_PACKED_SIMD 1
#if defined(__AVX512F__)
typedef __m512 pv;
typedef __m512i pvi;
constexpr int kPW = 16;
inline pv p_zero() { return _mm512_setzero_ps(); }
inline pv p_set1(float a) { return _mm512_set1_ps(a); }
inline pv p_load(const float* p) { return _mm512_loadu_ps(p); }
inline pv p_fma(pv a, pv b, pv c) { return _mm512_fmadd_ps(a, b, c); }
inline pv p_mul(pv a, pv b) { return _mm512_mul_ps(a, b); }
inline pv p_add(pv a, pv b) { return _mm512_add_ps(a, b); }
#else
typedef __m256 pv;
typedef __m256i pvi;
constexpr int kPW = 8;
inline pv p_zero() { return _mm256_setzero_ps(); }
inline pv p_set1(float a) { return _mm256_set1_ps(a); }
inline pv p_load(const float* p) { return _mm256_loadu_ps(p); }
inline pv p_fma(pv a, pv b, pv c) { return _mm256_fmadd_ps(a, b, c); }
inline pv p_mul(pv a, pv b) { return _mm256_mul_ps(a, b); }
inline pv p_add(pv a, pv b) { return _mm256_add_ps(a, b); }
#endif
constexpr int kPV = 32 / kPW;  // vectors per 32-element block
static_assert(kPW == kW, "pv and gemv_tile.h's vf32 are the same register");
inline float p_hsum(pv a) { return hsum(vf32(a)); }

// The kernels below step through a row 32 elements at a time: one block of the 32-element
// formats, half a BF16 block (64 bfloat16, 128 bytes). Formats without scales skip the scale pass.
template <PackedFormat F>
constexpr int simd_step_bytes() {
    return F == PackedFormat::BF16 ? packed_block_bytes(F) / 2 : packed_block_bytes(F);
}
template <PackedFormat F>
constexpr bool simd_has_scales() {
    return F != PackedFormat::F16 && F != PackedFormat::BF16;
}

// The step's 32 weights as kPV vectors, element order; s = {d, m} as f32 (the scale pass below).
template <PackedFormat F>
inline void widen_block(const uint8_t* blk, const float* s, pv* wv) {
    if constexpr (F == PackedFormat::F16) {  // 32 halves, converted exactly (vcvtph2ps)
        (void)s;
#if defined(__AVX512F__)
        for (int v = 0; v < 2; ++v) wv[v] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * v)));
#else
        for (int v = 0; v < 4; ++v) wv[v] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * v)));
#endif
    } else if constexpr (F == PackedFormat::BF16) {  // 32 bfloat16: the f32 bits are the half's bits << 16, exactly
        (void)s;
#if defined(__AVX512F__)
        for (int v = 0; v < 2; ++v)
            wv[v] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * v))), 16));
#else
        for (int v = 0; v < 4; ++v)
            wv[v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * v))), 16));
#endif
    } else if constexpr (F == PackedFormat::Q8_0) {
        const pv d = p_set1(s[0]);
#if defined(__AVX512F__)
        for (int v = 0; v < 2; ++v)
            wv[v] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + 16 * v)))));
#else
        for (int v = 0; v < 4; ++v)
            wv[v] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * v)))));
#endif
    } else if constexpr (F == PackedFormat::Q5_0 || F == PackedFormat::Q5_1) {
        // Nibbles as Q4_0/Q4_1; the 5th bit of element j is bit j of the u32 qh, moved to bit 4
        // per lane by a variable shift. Q5_0: float(q - 16) * d; Q5_1: float(q) * d + m, with
        // q * d exact (5 by 11 significant bits), so the FMA rounds once like the block function.
        constexpr int qh_at = F == PackedFormat::Q5_1 ? 4 : 2, qs_at = qh_at + 4;
        uint32_t qh;
        std::memcpy(&qh, blk + qh_at, 4);
#if defined(__AVX512F__)
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + qs_at)));
        const __m512i hb = _mm512_set1_epi32(int(qh)), one = _mm512_set1_epi32(1), m15 = _mm512_set1_epi32(15);
        const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        auto bit4 = [&](__m512i shift) { return _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(hb, shift), one), 4); };
        const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, m15), bit4(iota));
        const __m512i hi = _mm512_or_si512(_mm512_srli_epi32(q, 4), bit4(_mm512_add_epi32(iota, _mm512_set1_epi32(16))));
        const __m512 dv = _mm512_set1_ps(s[0]);
        if constexpr (F == PackedFormat::Q5_0) {
            const __m512i m16 = _mm512_set1_epi32(16);
            wv[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, m16)), dv);
            wv[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, m16)), dv);
        } else {
            const __m512 mv = _mm512_set1_ps(s[1]);
            wv[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), dv, mv);
            wv[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), dv, mv);
        }
#else
        const __m256i hb = _mm256_set1_epi32(int(qh)), one = _mm256_set1_epi32(1), m15 = _mm256_set1_epi32(15);
        const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        auto bit4 = [&](int first) {  // bits first .. first + 7 of qh, at bit 4 of each lane
            return _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(hb, _mm256_add_epi32(iota, _mm256_set1_epi32(first))), one), 4);
        };
        const __m256 dv = _mm256_set1_ps(s[0]);
        for (int h = 0; h < 2; ++h) {  // bytes 8h .. 8h + 7: elements 8h + j (low nibble), 16 + 8h + j (high)
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + qs_at + 8 * h)));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m15), bit4(8 * h));
            const __m256i hi = _mm256_or_si256(_mm256_srli_epi32(q, 4), bit4(16 + 8 * h));
            if constexpr (F == PackedFormat::Q5_0) {
                const __m256i m16 = _mm256_set1_epi32(16);
                wv[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, m16)), dv);
                wv[2 + h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, m16)), dv);
            } else {
                const __m256 mv = _mm256_set1_ps(s[1]);
                wv[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), dv, mv);
                wv[2 + h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), dv, mv);
            }
        }
#endif
    } else {
        constexpr int off = F == PackedFormat::Q4_1 ? 4 : 2;
#if defined(__AVX512F__)
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        __m512 t;
        if constexpr (F == PackedFormat::Q4_1)
            t = _mm512_fmadd_ps(iota, _mm512_set1_ps(s[0]), _mm512_set1_ps(s[1]));  // iota * d is exact: one rounding either way
        else
            t = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(8.0f)), _mm512_set1_ps(s[0]));  // float(q - 8) exactly
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + off)));
        wv[0] = _mm512_permutexvar_ps(q, t);
        wv[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), t);
#else
        const __m256 dv = _mm256_set1_ps(s[0]);
        const __m256i m15 = _mm256_set1_epi32(15);
        for (int h = 0; h < 2; ++h) {  // bytes 8h .. 8h + 7: elements 8h + j (low), 16 + 8h + j (high)
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + off + 8 * h)));
            __m256i lo = _mm256_and_si256(q, m15), hi = _mm256_srli_epi32(q, 4);
            if constexpr (F == PackedFormat::Q4_1) {
                const __m256 mv = _mm256_set1_ps(s[1]);
                wv[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), dv, mv);  // q * d is exact: one rounding either way
                wv[2 + h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), dv, mv);
            } else {
                const __m256i m8 = _mm256_set1_epi32(8);
                wv[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(lo, m8)), dv);
                wv[2 + h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(hi, m8)), dv);
            }
        }
#endif
    }
}

// Rows [0, RB) of w (row stride row_bytes) times the M rows of x; A accumulators per (row, x row)
// so that RB * M * A >= 8 independent FMA chains hide the FMA latency.
// The f16 scales of a segment of blocks are converted first, into a small L1 buffer: vcvtph2ps
// from memory takes 4 halves (d, m and 4 quant bytes we ignore) without the shuffle port, and
// the main loop then broadcasts d and m straight from L1. Converting them inside the loop
// (insert, convert, broadcast) put 9 shuffle-port uops on each row-block of Q4_1 where the
// permutes need 3: the loop ran at ~9 cycles per block, bound by that port.
// Prefetch: the RB rows of a pass and the passes after it are one contiguous stream; every
// cache line of it is prefetched into L2 kPrefetchAhead bytes ahead of what the pass has
// consumed, by a line cursor. The previous form (one prefetch per block step, one row group
// ahead) skipped every 4th-5th line of Q4_1's 80-byte steps and was ~1440 bytes ahead; the lab
// (kvlab_lab_packed_gemv, one thread, AVX-512) measured one decode token's matmuls at 0.65x of
// the read rate with it, 0.71x with every line one group ahead, 0.79-0.81x at 4-8 KiB ahead
// (2 KiB: 0.72x). Two blocks per step, 1 or 2 rows per pass and, for Q8_0, x . q summed per
// block then scaled by d were measured too and were no faster (docs/PERFORMANCE.md).
constexpr int64_t kSegBlocks = 64;
constexpr int64_t kPrefetchAhead = 4096;
template <PackedFormat F, int M, int RB>
inline void gemv_rows_simd(int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int BB = simd_step_bytes<F>();
    constexpr int A = RB * M >= 8 ? 1 : (8 + RB * M - 1) / (RB * M) < kPV ? (8 + RB * M - 1) / (RB * M) : kPV;
    alignas(64) float sc[RB * kSegBlocks * 2 + 2];
    pv acc[RB][M][A];
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
            for (int a = 0; a < A; ++a) acc[r][m][a] = p_zero();
    const uint8_t* pf_base = w + kPrefetchAhead;
    int64_t pf = 0;  // bytes of the stream prefetched so far, from pf_base
    for (int64_t b0 = 0; b0 < nblocks; b0 += kSegBlocks) {
        const int64_t nb = std::min(kSegBlocks, nblocks - b0);
        for (int r = 0; r < RB && simd_has_scales<F>(); ++r) {
            const uint8_t* blk = w + r * row_bytes + b0 * BB;
            float* o = sc + r * kSegBlocks * 2;
            // 8 bytes from the block start (every format here has >= 18): halves d, m (Q4_1), then quants.
            for (int64_t b = 0; b < nb; ++b)
                _mm_storeu_ps(o + 2 * b, _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + b * BB))));
        }
        for (int64_t b = 0; b < nb; ++b) {
            for (const int64_t upto = (b0 + b + 1) * RB * BB; pf < upto; pf += 64) __builtin_prefetch(pf_base + pf, 0, 2);
            const float* xb = x + (b0 + b) * 32;
            pv xv[M][kPV];
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
                for (int v = 0; v < kPV; ++v) xv[m][v] = p_load(xb + m * ldx + v * kPW);
#pragma GCC unroll 8
            for (int r = 0; r < RB; ++r) {
                pv wv[kPV];
                widen_block<F>(w + r * row_bytes + (b0 + b) * BB, sc + r * kSegBlocks * 2 + 2 * b, wv);
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
                    for (int v = 0; v < kPV; ++v) acc[r][m][v % A] = p_fma(xv[m][v], wv[v], acc[r][m][v % A]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
            pv t = acc[r][m][0];
#pragma GCC unroll 4
            for (int a = 1; a < A; ++a) t = p_add(t, acc[r][m][a]);
            y[m * ldy + r] = p_hsum(t);
        }
}

template <PackedFormat F, int M>
void gemv_simd(int64_t n, int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int RB = M <= 2 ? 4 : (kPW == 16 ? 4 : 2);
    int64_t r = 0;
    for (; r + RB <= n; r += RB) gemv_rows_simd<F, M, RB>(nblocks, w + r * row_bytes, row_bytes, x, ldx, y + r, ldy);
    for (; r < n; ++r) gemv_rows_simd<F, M, 1>(nblocks, w + r * row_bytes, row_bytes, x, ldx, y + r, ldy);
}

// ---- k-quants (Q4_K, Q5_K, Q6_K): 256-element super-blocks ------------------------------------
// The published GGUF files' formats. Through the block functions (packed_blocks.h: 256 floats
// per super-block, one value at a time, into a buffer) decode ran at 0.03x (Q6_K) to 0.10x
// (Q4_K, Q5_K) of a plain read of the bytes (kvlab_lab_packed_gemv). Here the scales and mins
// come from the block function's own f32 operations once per super-block and row, and the
// quants are widened in registers.

constexpr bool is_kquant(PackedFormat f) { return f == PackedFormat::Q4_K || f == PackedFormat::Q5_K || f == PackedFormat::Q6_K; }

// ds: Q4_K/Q5_K d * sc[s] per step s; Q6_K d * scales[i] per 16 elements (two per step).
// ms: Q4_K/Q5_K dmin * mn[s] per step (Q6_K has no mins). The same f32 products as the block
// functions (exact int -> float, one rounding each); Q4_K/Q5_K's 6-bit fields are unpacked 8 at a
// time (k_scale_min's rule per lane: j < 4 from bytes j and j + 4, j >= 4 from bytes j + 4 and the
// top bits of bytes j - 4 and j).
template <PackedFormat F>
inline void kquant_scales(const uint8_t* b, float* ds, float* ms) {
    namespace B = gguf_blocks;
    if constexpr (F == PackedFormat::Q6_K) {
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = B::half_at(b + 208);
        for (int i = 0; i < 16; ++i) ds[i] = d * float(sc[i]);
    } else {
        const __m256 d = _mm256_set1_ps(B::half_at(b)), dmin = _mm256_set1_ps(B::half_at(b + 2));
        const uint8_t* s6 = b + 4;
        const __m256i A = _mm256_setr_epi32(s6[0], s6[1], s6[2], s6[3], s6[8], s6[9], s6[10], s6[11]);
        const __m256i C = _mm256_setr_epi32(s6[0], s6[1], s6[2], s6[3], s6[0], s6[1], s6[2], s6[3]);
        const __m256i D = _mm256_setr_epi32(s6[4], s6[5], s6[6], s6[7], s6[4], s6[5], s6[6], s6[7]);
        const __m256i upper = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
        const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
        auto top2 = [](__m256i v) { return _mm256_slli_epi32(_mm256_srli_epi32(v, 6), 4); };
        const __m256i sc = _mm256_blendv_epi8(_mm256_and_si256(A, m63), _mm256_or_si256(_mm256_and_si256(A, m15), top2(C)), upper);
        const __m256i mn = _mm256_blendv_epi8(_mm256_and_si256(D, m63), _mm256_or_si256(_mm256_srli_epi32(A, 4), top2(D)), upper);
        _mm256_storeu_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
        _mm256_storeu_ps(ms, _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(mn)));
    }
}

inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(a, _mm_movehdup_ps(a)));
}

// Each row is its own stream; every line of it is prefetched this far ahead.
constexpr int64_t kKquantAhead = 1024;

// Vector helpers over the variant's register (kPW lanes of 32 bits).
#if defined(__AVX512F__)
inline pvi k_widen(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline pvi k_srl(pvi a, int n) { return _mm512_srli_epi32(a, unsigned(n)); }
inline pvi k_sll(pvi a, int n) { return _mm512_slli_epi32(a, unsigned(n)); }
inline pvi k_and(pvi a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
inline pvi k_or(pvi a, pvi c) { return _mm512_or_si512(a, c); }
inline pvi k_sub(pvi a, int c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
inline pv k_float(pvi a) { return _mm512_cvtepi32_ps(a); }
#else
inline pvi k_widen(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline pvi k_srl(pvi a, int n) { return _mm256_srli_epi32(a, n); }
inline pvi k_sll(pvi a, int n) { return _mm256_slli_epi32(a, n); }
inline pvi k_and(pvi a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
inline pvi k_or(pvi a, pvi c) { return _mm256_or_si256(a, c); }
inline pvi k_sub(pvi a, int c) { return _mm256_sub_epi32(a, _mm256_set1_epi32(c)); }
inline pv k_float(pvi a) { return _mm256_cvtepi32_ps(a); }
#endif
// (v >> n) & (mask >> 4) moved to bit 4: one shift (left or right) and one mask.
inline pvi k_to_bit4(pvi v, int n, int mask) { return k_and(n < 4 ? k_sll(v, 4 - n) : n > 4 ? k_srl(v, n - 4) : v, mask); }

// The dot products are factored per 32-element step (Q4_K, Q5_K) or 16-element scale group
// (Q6_K): sum_l (d_s q_l - m_s) x_l = d_s sum_l q_l x_l - m_s sum_l x_l, so each weight costs a
// conversion and one FMA, the step's scale one FMA per row, and the mins one scalar product of
// the 8 step sums of x per super-block (formed once for all rows of a pass). As with
// Q4_1_R16 the result equals the dequantized path to f32 rounding, not term by term; a one-hot
// x still reads every weight bit for bit (d_s q rounded once, then less m_s).
// Q4_K / Q5_K, rows [0, RB) of w: step pair g = 0..3 is the 32 bytes qs[32g ..], low nibbles
// step 2g, high nibbles step 2g + 1, each byte widened once for both; Q5_K's 5th bits are bits
// 2g and 2g + 1 of qh[l].
// xs[m * nsuper * 8 + s]: x_block_sums of the M rows of x (32-element steps).
template <PackedFormat F, int M, int RB>
void gemv_k45_rows(int64_t nsuper, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, const float* xs, float* y,
                   int64_t ldy) {
    constexpr int SB = packed_block_bytes(F), QS = F == PackedFormat::Q4_K ? 16 : 48;
    pv acc[RB][M];
    __m256 mins[RB][M];  // lane s: the min terms of step s, summed over super-blocks
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) {
            acc[r][m] = p_zero();
            mins[r][m] = _mm256_setzero_ps();
        }
    for (int64_t b = 0; b < nsuper; ++b) {
        alignas(32) float ds[RB][16], ms[RB][8];
        for (int r = 0; r < RB; ++r) {
            const uint8_t* blk = w + r * row_bytes + b * SB;
            for (int o = 0; o < SB; o += 64) __builtin_prefetch(blk + kKquantAhead + o, 0, 2);
            kquant_scales<F>(blk, ds[r], ms[r]);
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m)
                mins[r][m] = _mm256_fmadd_ps(_mm256_load_ps(ms[r]), _mm256_loadu_ps(xs + (m * nsuper + b) * 8), mins[r][m]);
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
            pv slo[RB][M], shi[RB][M];
#pragma GCC unroll 4
            for (int v = 0; v < kPV; ++v) {
                const int o = v * kPW;
#pragma GCC unroll 4
                for (int r = 0; r < RB; ++r) {
                    const uint8_t* blk = w + r * row_bytes + b * SB;
                    const pvi raw = k_widen(blk + QS + 32 * g + o);
                    pvi lo = k_and(raw, 15), hi = k_srl(raw, 4);
                    if constexpr (F == PackedFormat::Q5_K) {
                        const pvi qh = k_widen(blk + 16 + o);
                        lo = k_or(lo, k_to_bit4(qh, 2 * g, 16));
                        hi = k_or(hi, k_to_bit4(qh, 2 * g + 1, 16));
                    }
                    const pv flo = k_float(lo), fhi = k_float(hi);
#pragma GCC unroll 4
                    for (int m = 0; m < M; ++m) {
                        const float* xb = x + m * ldx + b * 256 + 64 * g + o;
                        slo[r][m] = v == 0 ? p_mul(flo, p_load(xb)) : p_fma(flo, p_load(xb), slo[r][m]);
                        shi[r][m] = v == 0 ? p_mul(fhi, p_load(xb + 32)) : p_fma(fhi, p_load(xb + 32), shi[r][m]);
                    }
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m) {
                    acc[r][m] = p_fma(p_set1(ds[r][2 * g]), slo[r][m], acc[r][m]);
                    acc[r][m] = p_fma(p_set1(ds[r][2 * g + 1]), shi[r][m], acc[r][m]);
                }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
        for (int m = 0; m < M; ++m) y[m * ldy + r] = p_hsum(acc[r][m]) - hsum8(mins[r][m]);
}

// Q6_K, one row: half h = 0..1 is 128 elements; ql[64h + l] holds elements 32k + l of k = 0
// (low nibble) and k = 2 (high), ql[64h + 32 + l] those of k = 1 and 3, qh[32h + l] the 2 high
// bits of all four (bits 2k); scale i = 8h + 2k + l / 16. Each byte is widened once for its
// elements.
template <int M>
void gemv_k6_row(int64_t nsuper, const uint8_t* w, const float* x, int64_t ldx, float* y, int64_t ldy) {
    constexpr int SB = packed_block_bytes(PackedFormat::Q6_K);
    constexpr int VH = 16 / kPW;  // vectors per 16-element scale group
    pv acc[M];
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) acc[m] = p_zero();
    for (int64_t b = 0; b < nsuper; ++b) {
        const uint8_t* blk = w + b * SB;
        for (int o = 0; o < SB; o += 64) __builtin_prefetch(blk + kKquantAhead + o, 0, 2);
        float ds[16], unused[8];
        kquant_scales<PackedFormat::Q6_K>(blk, ds, unused);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
            for (int half = 0; half < 2; ++half) {  // l < 16, l >= 16: scales 8h + 2k, 8h + 2k + 1
                pv s[4][M];
#pragma GCC unroll 2
                for (int u = 0; u < VH; ++u) {
                    const int o = 16 * half + u * kPW;
                    const pvi l0 = k_widen(blk + 64 * h + o), l1 = k_widen(blk + 64 * h + 32 + o), hb = k_widen(blk + 128 + 32 * h + o);
#pragma GCC unroll 4
                    for (int k = 0; k < 4; ++k) {
                        const pvi low = k < 2 ? k_and(k & 1 ? l1 : l0, 15) : k_srl(k & 1 ? l1 : l0, 4);
                        const pv q = k_float(k_sub(k_or(low, k_to_bit4(hb, 2 * k, 48)), 32));
#pragma GCC unroll 4
                        for (int m = 0; m < M; ++m) {
                            const float* xb = x + m * ldx + b * 256 + 128 * h + 32 * k + o;
                            s[k][m] = u == 0 ? p_mul(q, p_load(xb)) : p_fma(q, p_load(xb), s[k][m]);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int k = 0; k < 4; ++k)
#pragma GCC unroll 4
                    for (int m = 0; m < M; ++m) acc[m] = p_fma(p_set1(ds[8 * h + 2 * k + half]), s[k][m], acc[m]);
            }
    }
#pragma GCC unroll 4
    for (int m = 0; m < M; ++m) y[m * ldy] = p_hsum(acc[m]);
}

// xs: x_block_sums of x (Q4_K, Q5_K; matmul_packed forms them once per call, see
// gemv_reads_step_sums).
template <PackedFormat F, int M>
void gemv_kquant(int64_t n, int64_t nsuper, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx, const float* xs,
                 float* y, int64_t ldy) {
    if constexpr (F == PackedFormat::Q6_K) {
        for (int64_t r = 0; r < n; ++r) gemv_k6_row<M>(nsuper, w + r * row_bytes, x, ldx, y + r, ldy);
    } else {
        constexpr int RB = M == 1 ? 2 : 1;
        int64_t r = 0;
        for (; r + RB <= n; r += RB) gemv_k45_rows<F, M, RB>(nsuper, w + r * row_bytes, row_bytes, x, ldx, xs, y + r, ldy);
        for (; r < n; ++r) gemv_k45_rows<F, M, 1>(nsuper, w + r * row_bytes, row_bytes, x, ldx, xs, y + r, ldy);
    }
}
#endif

// ---- Q4_1_R16: one column of 8 rows per vector ------------------------------------------------
// A group block holds 16 rows x 32 columns as two halves of 8 rows (packed_blocks.h), so a
// vector's 8 lanes are 8 rows and every x value is one broadcast: no per-row scale pass, no
// horizontal sums. The block's dot product is factored, sum_j (q_j d + m) x_j =
// d sum_j q_j x_j + m sum_j x_j, with the column sums of x (xs) formed once per call: 2 FMAs per
// weight vector become 1, and d and m of 8 rows are one conversion each. The weight values are
// not formed, so the result equals the dequantized path to f32 rounding rather than term by
// term (tests: PackedKernel.*Q4_1x16*; a one-hot x still reads every weight bit for bit).
// One x row takes both halves per pass: each x broadcast serves 16 rows, and the halves' 2 + 2
// chains of 16 FMAs per block overlap where one half's 4 chains of 8 left the FMA latency exposed
// at every block's end (kvlab_lab_packed_gemv and docs/PERFORMANCE.md have the rates).

#if defined(KV_PACKED_SIMD)
// Every line of the stream is also asked for (into L2) this far ahead: the lab's Q4_1x16 shapes
// went from 0.55-0.58x to 0.64-0.72x of a plain read at one thread and from 0.51-0.62x to
// 0.65-0.67x at two (8 KiB: mixed). The hardware prefetcher alone trails the demand misses.
constexpr int64_t kR16PrefetchAhead = 4096;
// One x row: y[16 g .. 16 g + 15] for each group.
void gemv_r16_one(int64_t ngroups, int64_t nblocks, const uint8_t* w, int64_t group_bytes, const float* x, const float* xs, float* y) {
    namespace B = gguf_blocks;
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int64_t g = 0; g < ngroups; ++g) {
        const uint8_t* wg = w + g * group_bytes;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, accm0 = acc0, accm1 = acc0;
        for (int64_t b = 0; b < nblocks; ++b) {
            const uint8_t* t0 = wg + b * B::kQ41GroupBytes;
            const uint8_t* t1 = t0 + B::kQ41HalfBytes;
            const float* xb = x + b * 32;
            for (int o = 0; o < B::kQ41GroupBytes; o += 64) __builtin_prefetch(t0 + kR16PrefetchAhead + o, 0, 2);
            __m256 s0[2], s1[2];
#pragma GCC unroll 16
            for (int p = 0; p < 16; ++p) {  // quant bytes p of 8 rows: columns p (low nibble) and p + 16 (high)
                const __m256 xl = _mm256_broadcast_ss(xb + p), xh = _mm256_broadcast_ss(xb + p + 16);
                const __m256i q0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(t0 + 32 + 8 * p)));
                const __m256i q1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(t1 + 32 + 8 * p)));
                const __m256 l0 = _mm256_cvtepi32_ps(_mm256_and_si256(q0, m15)), l1 = _mm256_cvtepi32_ps(_mm256_and_si256(q1, m15));
                const __m256 h0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), h1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4));
                const int c = p % 2;
                s0[c] = p < 2 ? _mm256_mul_ps(l0, xl) : _mm256_fmadd_ps(l0, xl, s0[c]);
                s1[c] = p < 2 ? _mm256_mul_ps(l1, xl) : _mm256_fmadd_ps(l1, xl, s1[c]);
                s0[c] = _mm256_fmadd_ps(h0, xh, s0[c]);
                s1[c] = _mm256_fmadd_ps(h1, xh, s1[c]);
            }
            const __m256 xsb = _mm256_broadcast_ss(xs + b);
            acc0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t0))), _mm256_add_ps(s0[0], s0[1]), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t1))), _mm256_add_ps(s1[0], s1[1]), acc1);
            accm0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t0 + 16))), xsb, accm0);
            accm1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t1 + 16))), xsb, accm1);
        }
        _mm256_storeu_ps(y + 16 * g, _mm256_add_ps(acc0, accm0));
        _mm256_storeu_ps(y + 16 * g + 8, _mm256_add_ps(acc1, accm1));
    }
}

// M x rows (2..4): one half (8 rows) per pass, every half's block read once for all M rows.
template <int M>
void gemv_r16_rows_of_x(int64_t ngroups, int64_t nblocks, const uint8_t* w, int64_t group_bytes, const float* x, int64_t ldx,
                        const float* xs, float* y, int64_t ldy) {
    namespace B = gguf_blocks;
    constexpr int NC = M == 2 ? 2 : 1;  // independent chains per x row over a block's 32 columns
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int64_t g = 0; g < ngroups; ++g)
        for (int h = 0; h < 2; ++h) {
            const uint8_t* wh = w + g * group_bytes + h * B::kQ41HalfBytes;
            __m256 acc[M], accm[M];
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m) acc[m] = accm[m] = _mm256_setzero_ps();
            for (int64_t b = 0; b < nblocks; ++b) {
                const uint8_t* t = wh + b * B::kQ41GroupBytes;
                const float* xb = x + b * 32;
                for (int o = 0; o < B::kQ41HalfBytes; o += 64) __builtin_prefetch(t + kR16PrefetchAhead + o, 0, 2);
                __m256 sq[M][NC];
#pragma GCC unroll 16
                for (int p = 0; p < 16; ++p) {
                    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + 32 + 8 * p)));
                    const __m256 lo = _mm256_cvtepi32_ps(_mm256_and_si256(q, m15)), hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(q, 4));
#pragma GCC unroll 4
                    for (int m = 0; m < M; ++m) {
                        const __m256 xl = _mm256_broadcast_ss(xb + m * ldx + p), xh = _mm256_broadcast_ss(xb + m * ldx + p + 16);
                        const int cl = (2 * p) % NC, ch = (2 * p + 1) % NC;
                        sq[m][cl] = 2 * p < NC ? _mm256_mul_ps(lo, xl) : _mm256_fmadd_ps(lo, xl, sq[m][cl]);
                        sq[m][ch] = 2 * p + 1 < NC ? _mm256_mul_ps(hi, xh) : _mm256_fmadd_ps(hi, xh, sq[m][ch]);
                    }
                }
                const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t)));
                const __m256 mv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16)));
#pragma GCC unroll 4
                for (int m = 0; m < M; ++m) {
                    __m256 sm = sq[m][0];
                    if constexpr (NC == 2) sm = _mm256_add_ps(sq[m][0], sq[m][1]);
                    acc[m] = _mm256_fmadd_ps(dv, sm, acc[m]);
                    accm[m] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + m * nblocks + b), accm[m]);
                }
            }
#pragma GCC unroll 4
            for (int m = 0; m < M; ++m) _mm256_storeu_ps(y + m * ldy + 16 * g + 8 * h, _mm256_add_ps(acc[m], accm[m]));
        }
}
#endif

// Portable form (the base variant): the same factored sums, one row at a time.
template <int M>
void gemv_r16_portable(int64_t ngroups, int64_t nblocks, const uint8_t* w, int64_t group_bytes, const float* x, int64_t ldx,
                       const float* xs, float* y, int64_t ldy) {
    namespace B = gguf_blocks;
    for (int64_t g = 0; g < ngroups; ++g)
        for (int r = 0; r < B::kQ41Rows; ++r) {
            const int i = r % B::kQ41HalfRows;  // row i of half r / 8
            float acc[M] = {}, accm[M] = {};
            for (int64_t b = 0; b < nblocks; ++b) {
                const uint8_t* t = w + g * group_bytes + b * B::kQ41GroupBytes + r / B::kQ41HalfRows * B::kQ41HalfBytes;
                const float d = B::half_at(t + 2 * i), mn = B::half_at(t + 16 + 2 * i);
                for (int m = 0; m < M; ++m) {
                    const float* xb = x + m * ldx + b * 32;
                    float s[4] = {};
                    for (int p = 0; p < 16; ++p) {
                        const uint8_t q = t[32 + 8 * p + i];
                        s[(2 * p) % 4] += float(q & 15) * xb[p];
                        s[(2 * p + 1) % 4] += float(q >> 4) * xb[p + 16];
                    }
                    acc[m] += d * ((s[0] + s[2]) + (s[1] + s[3]));
                    accm[m] += mn * xs[m * nblocks + b];
                }
            }
            for (int m = 0; m < M; ++m) y[m * ldy + 16 * g + r] = acc[m] + accm[m];
        }
}

// y[m * ldy + j] for the 16 * ngroups rows j of a Q4_1_R16 weight; xs from x_block_sums.
void gemv_r16(int M, int64_t ngroups, int64_t nblocks, const uint8_t* w, int64_t group_bytes, const float* x, int64_t ldx, const float* xs,
              float* y, int64_t ldy) {
#if defined(KV_PACKED_SIMD)
    switch (M) {
        case 1: gemv_r16_one(ngroups, nblocks, w, group_bytes, x, xs, y); return;
        case 2: gemv_r16_rows_of_x<2>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
        case 3: gemv_r16_rows_of_x<3>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
        default: gemv_r16_rows_of_x<4>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
    }
#else
    switch (M) {
        case 1: gemv_r16_portable<1>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
        case 2: gemv_r16_portable<2>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
        case 3: gemv_r16_portable<3>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
        default: gemv_r16_portable<4>(ngroups, nblocks, w, group_bytes, x, ldx, xs, y, ldy); return;
    }
#endif
}

template <PackedFormat F>
void gemv_packed(int M, int64_t n, int64_t nblocks, const uint8_t* w, int64_t row_bytes, const float* x, int64_t ldx,
                 [[maybe_unused]] const float* xs, float* y, int64_t ldy) {
#if defined(KV_PACKED_SIMD)
    if constexpr (F == PackedFormat::Q8_0 || F == PackedFormat::Q4_0 || F == PackedFormat::Q4_1 || F == PackedFormat::Q5_0 ||
                  F == PackedFormat::Q5_1 || F == PackedFormat::F16 || F == PackedFormat::BF16) {
        const int64_t steps = nblocks * packed_block_elems(F) / 32;
        switch (M) {
            case 1: gemv_simd<F, 1>(n, steps, w, row_bytes, x, ldx, y, ldy); return;
            case 2: gemv_simd<F, 2>(n, steps, w, row_bytes, x, ldx, y, ldy); return;
            case 3: gemv_simd<F, 3>(n, steps, w, row_bytes, x, ldx, y, ldy); return;
            default: gemv_simd<F, 4>(n, steps, w, row_bytes, x, ldx, y, ldy); return;
        }
    }
    if constexpr (is_kquant(F)) {
        switch (M) {
            case 1: gemv_kquant<F, 1>(n, nblocks, w, row_bytes, x, ldx, xs, y, ldy); return;
            case 2: gemv_kquant<F, 2>(n, nblocks, w, row_bytes, x, ldx, xs, y, ldy); return;
            case 3: gemv_kquant<F, 3>(n, nblocks, w, row_bytes, x, ldx, xs, y, ldy); return;
            default: gemv_kquant<F, 4>(n, nblocks, w, row_bytes, x, ldx, xs, y, ldy); return;
        }
    }
#endif
    switch (M) {
        case 1: gemv_packed_rows<F, 1>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        case 2: gemv_packed_rows<F, 2>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        case 3: gemv_packed_rows<F, 3>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
        default: gemv_packed_rows<F, 4>(n, nblocks, w, row_bytes, x, ldx, y, ldy); break;
    }
}

using GemvFn = void (*)(int, int64_t, int64_t, const uint8_t*, int64_t, const float*, int64_t, const float*, float*, int64_t);

// Whether the decode kernel of f reads x_block_sums (its blocks' dot products factored).
bool gemv_reads_step_sums(PackedFormat f) {
#if defined(KV_PACKED_SIMD)
    if (f == PackedFormat::Q4_K || f == PackedFormat::Q5_K) return true;
#endif
    return f == PackedFormat::Q4_1_R16;
}
using DequantFn = void (*)(const uint8_t*, float*);

GemvFn gemv_fn(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return gemv_packed<PackedFormat::Q8_0>;
        case PackedFormat::Q4_0: return gemv_packed<PackedFormat::Q4_0>;
        case PackedFormat::Q4_1: return gemv_packed<PackedFormat::Q4_1>;
        case PackedFormat::Q5_0: return gemv_packed<PackedFormat::Q5_0>;
        case PackedFormat::Q5_1: return gemv_packed<PackedFormat::Q5_1>;
        case PackedFormat::Q4_K: return gemv_packed<PackedFormat::Q4_K>;
        case PackedFormat::Q5_K: return gemv_packed<PackedFormat::Q5_K>;
        case PackedFormat::Q6_K: return gemv_packed<PackedFormat::Q6_K>;
        case PackedFormat::NF4: return gemv_packed<PackedFormat::NF4>;
        case PackedFormat::F16: return gemv_packed<PackedFormat::F16>;
        case PackedFormat::BF16: return gemv_packed<PackedFormat::BF16>;
        default: return nullptr;
    }
}

DequantFn dequant_fn(PackedFormat f) {
    switch (f) {
        case PackedFormat::Q8_0: return dequant<PackedFormat::Q8_0>;
        case PackedFormat::Q4_0: return dequant<PackedFormat::Q4_0>;
        case PackedFormat::Q4_1: return dequant<PackedFormat::Q4_1>;
        case PackedFormat::Q5_0: return dequant<PackedFormat::Q5_0>;
        case PackedFormat::Q5_1: return dequant<PackedFormat::Q5_1>;
        case PackedFormat::Q4_K: return dequant<PackedFormat::Q4_K>;
        case PackedFormat::Q5_K: return dequant<PackedFormat::Q5_K>;
        case PackedFormat::Q6_K: return dequant<PackedFormat::Q6_K>;
        case PackedFormat::NF4: return dequant<PackedFormat::NF4>;
        case PackedFormat::F16: return dequant<PackedFormat::F16>;
        case PackedFormat::BF16: return dequant<PackedFormat::BF16>;
        default: return nullptr;
    }
}

// Rows [r0, r1) of packed W to f32, row-major with leading dimension C. Row-grouped Q4_1_R16:
// r0 a multiple of 16 and row_bytes those of a group; each block fills 16 rows of 32.
void dequant_rows(PackedFormat f, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1, int64_t nblocks, float* out) {
    const int bb = packed_block_bytes(f);
    if (f == PackedFormat::Q4_1_R16) {
        namespace B = gguf_blocks;
        constexpr int G = B::kQ41Rows;
        const int64_t C = nblocks * B::QK;
        alignas(64) float t[G * B::QK];
        for (int64_t g = r0 / G; g * G < r1; ++g)
            for (int64_t b = 0; b < nblocks; ++b) {
                B::dequant_q4_1_r16(w + g * row_bytes + b * bb, t);
                for (int r = 0; r < G && g * G + r < r1; ++r)
                    std::memcpy(out + (g * G + r - r0) * C + b * B::QK, t + r * B::QK, B::QK * sizeof(float));
            }
        return;
    }
    const DequantFn fn = dequant_fn(f);
    const int be = packed_block_elems(f);
    for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = 0; b < nblocks; ++b) fn(w + r * row_bytes + b * bb, out + (r - r0) * nblocks * be + b * be);
}

// An f32 row-major matrix view (rows x cols, leading dimension ld elements), optionally seen
// transposed (cols x rows).
TensorView f32_view(float* p, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
    TensorView v{};
    v.data = p;
    v.dtype = DType::F32;
    v.device = Device{};
    v.ndim = 2;
    if (!transposed) {
        v.ne[0] = rows, v.ne[1] = cols;
        v.nb[0] = ld * 4, v.nb[1] = 4;
    } else {
        v.ne[0] = cols, v.ne[1] = rows;
        v.nb[0] = 4, v.nb[1] = ld * 4;
    }
    return v;
}

OpCall f32_matmul(const TensorView& a, const TensorView& b, const TensorView& d, float alpha, float beta) {
    OpCall c;
    c.op = OpKind::MATMUL;
    c.p.alpha = alpha;
    c.p.beta = beta;
    c.dst = d;
    c.src[0] = a;
    c.src[1] = b;
    c.nsrc = 2;
    return c;
}

}  // namespace

bool matmul_packed_supported(const OpCall& c) {
    if (c.nsrc != 2 || c.src[1].dtype != DType::U8) return false;
    const TensorView &x = c.src[0], &w = c.src[1], &d = c.dst;
    if (x.dtype != DType::F32 || d.dtype != DType::F32 || x.ndim != 2 || w.ndim != 2 || d.ndim != 2) return false;
    if (x.nb[1] != 4 || w.nb[1] != 1 || w.nb[0] != w.ne[1] || d.nb[1] != 4 || x.ne[0] != d.ne[0]) return false;
    const bool tr = c.p.axis == 1;
    const int64_t k = tr ? d.ne[1] : x.ne[1];  // elements per packed row
    const PackedFormat f = packed_format_checked(c.p.qformat, k, w.ne[1]);
    if (f == PackedFormat::NONE) return false;
    const int64_t rows = w.ne[0] * packed_block_rows(f);  // a row-grouped weight's ne[0] counts groups
    return tr ? x.ne[1] == rows : d.ne[1] == rows;
}

void matmul_packed(const OpContext& ctx, const OpCall& c) {
    if (!matmul_packed_supported(c))
        throw KernelError("matmul: a packed weight needs f32 2-D x and dst with unit inner strides, a contiguous u8 weight "
                          "[rows, row bytes] and a known block format whose rows hold the matching element count");
    const TensorView &x = c.src[0], &w = c.src[1], &d = c.dst;
    const float alpha = c.p.alpha, beta = c.p.beta;
    const bool tr = c.p.axis == 1;
    const int64_t M = d.ne[0], row_bytes = w.ne[1];
    const int64_t C = tr ? d.ne[1] : x.ne[1];
    const PackedFormat f = packed_format_checked(c.p.qformat, C, row_bytes);
    const int64_t rb = packed_block_rows(f);  // weight rows per stored row (16: Q4_1_R16 groups)
    const int64_t Rw = w.ne[0], R = Rw * rb;  // stored rows, weight rows
    const int64_t nblocks = C / packed_block_cols(f);
    const uint8_t* wp = static_cast<const uint8_t*>(w.data);
    const float* xp = static_cast<const float*>(x.data);
    const int64_t ldx = x.nb[0] / 4, ldd = d.nb[0] / 4;
    float* dp = static_cast<float*>(d.data);
    if (M == 0 || R == 0 || C == 0) return;
    const int threads = std::max(1, kernel_threads(ctx));

    if (tr) {
        // dst (M, C) = alpha x (M, R) @ W (R, C) + beta dst: weight-row panels, accumulated.
        const int64_t rows = std::clamp<int64_t>((int64_t(1) << 20) / (C * 4) / rb * rb, rb, R);
        KernelScratch panel(ctx, size_t(rows * C) * 4);
        for (int64_t r0 = 0; r0 < R; r0 += rows) {
            const int64_t r1 = std::min(R, r0 + rows);
            dequant_rows(f, wp, row_bytes, r0, r1, nblocks, panel.as<float>());
            const TensorView a = f32_view(const_cast<float*>(xp) + r0, M, r1 - r0, ldx, false);
            const TensorView b = f32_view(panel.as<float>(), r1 - r0, C, C, false);
            matmul_forward(ctx, f32_matmul(a, b, d, alpha, r0 == 0 ? beta : 1.0f));
        }
        return;
    }

    if (M <= kPackedSmallM) {
        GemvFn fn = gemv_fn(f);
        // x's 32-element block sums, formed once by this thread and read by every unit.
        float* xs = gemv_reads_step_sums(f) ? scratch<float>(5, M * (C / 32)) : nullptr;
        if (xs) x_block_sums(M, C / 32, xp, ldx, xs);
        // Whole groups of 8 weight rows per unit, so the multi-row kernels run no single-row
        // tail mid-matrix (a Q4_1_R16 stored row is two). chunk, r0: weight rows.
        const int64_t chunk = rb > 1 ? std::max<int64_t>(1, kChunkBytes / row_bytes) * rb
                                     : std::clamp<int64_t>(kChunkBytes / row_bytes / 8 * 8, 8, std::max<int64_t>(R, 8));
        const int64_t units = (R + chunk - 1) / chunk;
        const bool acc = beta != 0.0f;
        auto run_unit = [&](int64_t u) {
            const int64_t r0 = u * chunk, n = std::min(chunk, R - r0);
            float* y = scratch<float>(4, M * chunk);
            if (f == PackedFormat::Q4_1_R16)
                gemv_r16(int(M), n / rb, nblocks, wp + r0 / rb * row_bytes, row_bytes, xp, ldx, xs, y, chunk);
            else
                fn(int(M), n, nblocks, wp + r0 * row_bytes, row_bytes, xp, ldx, xs, y, chunk);
            for (int64_t m = 0; m < M; ++m) {
                float* dr = dp + m * ldd + r0;
                const float* yr = y + m * chunk;
                if (acc)
                    for (int64_t j = 0; j < n; ++j) dr[j] = alpha * yr[j] + beta * dr[j];
                else
                    for (int64_t j = 0; j < n; ++j) dr[j] = alpha * yr[j];
            }
        };
        const int nt = Rw * row_bytes >= kParallelBytes ? int(std::min<int64_t>(threads, units)) : 1;
        run_units(nt, units, run_unit);
        return;
    }

    // Prefill: per-thread panels of weight rows; each panel's output columns are its own.
    // Many rows of x: one panel per thread (up to kLargePanelBytes), as few oneDNN calls as
    // possible, since every call packs all of x again; a few rows: L2-sized panels. Rows per
    // panel: a multiple of 16, or all R.
    auto rows_in = [C](int64_t bytes) { return std::max<int64_t>(16, bytes / (C * 4) / 16 * 16); };
    const int64_t per_thread = ((R + threads - 1) / threads + 15) / 16 * 16;
    const int64_t prow = M >= kLargePanelM ? std::min(per_thread, rows_in(kLargePanelBytes)) : std::clamp<int64_t>(rows_in(kPanelBytes), 16, R);
    const int64_t panels = (R + prow - 1) / prow;
    const int nt = int(std::min<int64_t>(threads, panels));
    KernelScratch buf(ctx, size_t(nt) * size_t(prow * C) * 4);
    OpContext one = ctx;
    one.threads = 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int64_t pi = 0; pi < panels; ++pi) {
        float* panel = buf.as<float>() + size_t(omp_get_thread_num()) * size_t(prow * C);
        const int64_t r0 = pi * prow, r1 = std::min(R, r0 + prow);
        dequant_rows(f, wp, row_bytes, r0, r1, nblocks, panel);
        const TensorView b = f32_view(panel, r1 - r0, C, C, true);  // W_panel^T (C, rows)
        const TensorView dd = f32_view(dp + r0, M, r1 - r0, ldd, false);
        matmul_forward(one, f32_matmul(x, b, dd, alpha, beta));
    }
}

}  // namespace kv::cpu
