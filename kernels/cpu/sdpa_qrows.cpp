// SDPA_QROWS on the CPU: attention over rows stored in a deployed KV format (fp8 E4M3/E5M2,
// NVFP4, MXFP4, TurboQuant; kernels/common/quant_formats.h), decoded as they are read, so
// no f32 copy of the cache exists. A unit is one (batch row, KV head) pair and a range of
// its slots, for all R heads of the group and all n queries; units run on the kernels'
// persistent pool (unit_pool.h). A unit walks its range in blocks of kBlock keys: the
// block's key rows are decoded into an L2-resident f32 tile (vectorised per kernel variant:
// fp8 through the f16 converter; FP4 codes by a 16-entry table times the block scale, a
// permute on AVX-512, on AVX2 one byte shuffle of the values' f16 top bytes; TurboQuant
// codes through its codebook, on AVX2 half of them through a table of both values of a
// byte, and its uniform codes converted without a table; each row's codes prefetched
// ahead), scored (on AVX-512 and AVX2 four keys per step with one transposing reduction,
// elsewhere by the decode path's gemv, gemv_tile.h), folded into the unit's online
// softmax, and the block's value rows decoded into the same tile and accumulated with one
// gemv. Ranges of a pair merge in range order, so the result does not depend on the thread
// count. Per-row factors (fp8's s, TurboQuant's key norm) multiply a key's score once;
// value factors multiply its weight.
//
// TurboQuant rows are stored rotated (y = R x, R orthogonal): a key's score q.x = (R q).y,
// so the query is rotated once per unit; values accumulate in the rotated frame and the
// output is rotated back once per query row.
//
// Weight sums take a second pass over the keys with each row's final max and sum.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#if defined(__AVX512F__)
// GCC 12 flags the intrinsics' own _mm512_undefined_* placeholders as (maybe-)uninitialized.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#endif

#include "cpu_common.h"
#include "gemv_tile.h"
#include "kernels/common/element_math.h"
#include "kernels/common/online_softmax.h"
#include "kernels/common/quant_formats.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

// AddressSanitizer refuses always_inline across target attributes: plain inline there.
#if defined(__SANITIZE_ADDRESS__)
#define KV_QR_INLINE inline
#else
#define KV_QR_INLINE __attribute__((always_inline)) inline
#endif

constexpr int64_t kBlock = 128;                         // keys decoded into the tile at once
constexpr int64_t kUnitsPerThread = 16;               // decode units per thread (key ranges of the pairs)
constexpr int64_t kParallelBytes = int64_t(64) << 10;  // code bytes below which one thread runs
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int32_t i32_at(const TensorView& v, int64_t off) {
    int32_t x;
    std::memcpy(&x, v.bytes() + off, 4);
    return x;
}

// ---- decoding primitives, one per ISA level ----------------------------------------------
// fp8_16: 16 codes -> 16 floats. nib16: 8 bytes -> 16 values, element 2j the low nibble of
// byte j (NVFP4, TurboQuant 4-bit), tab[code] * s + o. split32: 16 bytes -> 32 values,
// element j the low and j + 16 the high nibble of byte j (MXFP4), tab[code] * s.
// Finite fp8 codes: a normal code's exponent and mantissa move into an f32's, rebiased; a
// subnormal code is its mantissa times the smallest step. E4M3's NaN code (never written:
// the encoder saturates) decodes as a large finite value.
template <bool E5M2>
inline float fp8_scalar(uint8_t c) {
    const uint32_t mag = c & 0x7fu;
    const uint32_t bits = E5M2 ? (mag << 21) + (112u << 23) : (mag << 20) + (120u << 23);
    float normal;
    std::memcpy(&normal, &bits, 4);
    const float sub = float(int(mag)) * (E5M2 ? 0x1p-16f : 0x1p-9f);
    const float v = (E5M2 ? (mag >> 2) : (mag >> 3)) ? normal : sub;
    return (c & 0x80u) ? -v : v;
}

#if defined(__AVX512F__)
// fp8 through the f16 converter: E5M2 is the top byte of an f16; E4M3's magnitude bits moved
// into an f16's (the sign to bit 15, exponent and mantissa to bits 7..13) are the value
// / 2^8, subnormals included, so the row's factor takes the 2^8 (kFp8Unit).
template <bool E5M2>
KV_QR_INLINE __m256i fp8_to_f16_16(const uint8_t* p) {
    const __m256i c = _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 8);
    if (E5M2) return c;
    return _mm256_and_si256(_mm256_srai_epi16(c, 1), _mm256_set1_epi16(int16_t(0xbfff)));  // s s m.. -> s 0 m..
}
template <bool E5M2>
inline void fp8_16(const uint8_t* p, float* out) {
    _mm512_storeu_ps(out, _mm512_cvtph_ps(fp8_to_f16_16<E5M2>(p)));
}
template <bool E5M2>
constexpr float kFp8Unit = E5M2 ? 1.0f : 256.0f;
inline void nib16(const uint8_t* p, const float* tab, float s, float o, float* out) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m512i x = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));  // b0 b0 b1 b1 ...
    const __m512i sh = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    const __m512i idx = _mm512_and_si512(_mm512_srlv_epi32(x, sh), _mm512_set1_epi32(15));
    const __m512 v = _mm512_permutexvar_ps(idx, _mm512_loadu_ps(tab));
    _mm512_storeu_ps(out, _mm512_fmadd_ps(v, _mm512_set1_ps(s), _mm512_set1_ps(o)));
}
// Four horizontal sums at once (a, b, c, d -> their sums in one 128-bit vector): a
// transposing add tree, 11 instructions where four separate reductions take about 32.
KV_QR_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a02 b02 a13 b13 per lane
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                   _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));  // a b c d per lane
    const __m256 w = _mm256_add_ps(_mm512_castps512_ps256(u), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1));
}
// y[m * ldy + t] = x_m . w_t for M query rows and nk tile rows of D (D % 16 == 0): four keys
// per step, so a row's sums take one hsum4 per four keys instead of one reduction per key.
template <int M>
void dot_keys(int64_t nk, int64_t D, const float* x, const float* w, float* y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= nk; t += 4) {
        __m512 acc[M][4];
        for (int m = 0; m < M; ++m)
            for (int k = 0; k < 4; ++k) acc[m][k] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) {
            __m512 kv[4];
            for (int k = 0; k < 4; ++k) kv[k] = _mm512_loadu_ps(w + (t + k) * D + d);
            for (int m = 0; m < M; ++m) {
                const __m512 qv = _mm512_loadu_ps(x + m * D + d);
                for (int k = 0; k < 4; ++k) acc[m][k] = _mm512_fmadd_ps(qv, kv[k], acc[m][k]);
            }
        }
        for (int m = 0; m < M; ++m) _mm_storeu_ps(y + m * ldy + t, hsum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
    }
    for (; t < nk; ++t)
        for (int m = 0; m < M; ++m) {
            __m512 a = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * D + d), _mm512_loadu_ps(w + t * D + d), a);
            y[m * ldy + t] = _mm512_reduce_add_ps(a);
        }
}
// Scores of nk decoded keys for every query row (rows of D in x, sc rows of kBlock).
inline void score_tile(int64_t rows, int64_t nk, int64_t D, const float* x, const float* tile, float* sc) {
    if (D % 16 != 0) {
        for (int64_t r0 = 0; r0 < rows; r0 += 4)
            gemv_dot<float>(int(std::min<int64_t>(4, rows - r0)), nk, D, x + r0 * D, D, tile, D, sc + r0 * kBlock, kBlock);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += 3) {  // 3 rows x 4 keys: 12 accumulators, 4 keys, a query vector
        switch (std::min<int64_t>(3, rows - r0)) {
            case 1: dot_keys<1>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
            case 2: dot_keys<2>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
            default: dot_keys<3>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
        }
    }
}
// Two nib16 blocks (16 bytes) at once: both nibbles of every byte split with one mask and
// one shift, put in element order by byte interleaves (scales s0, s1 for the two blocks).
inline void nib32(const uint8_t* p, const float* tab, float s0, float s1, float o, float* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m512 t = _mm512_loadu_ps(tab), ov = _mm512_set1_ps(o);
    const __m512 v0 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), t);
    const __m512 v1 = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)), t);
    _mm512_storeu_ps(out, _mm512_fmadd_ps(v0, _mm512_set1_ps(s0), ov));
    _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(v1, _mm512_set1_ps(s1), ov));
}
inline void split32(const uint8_t* p, const float* tab, float s, float* out) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512 t = _mm512_loadu_ps(tab), sv = _mm512_set1_ps(s);
    const __m512i lo = _mm512_and_si512(x, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(x, 4);
    _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_permutexvar_ps(lo, t), sv));
    _mm512_storeu_ps(out + 16, _mm512_mul_ps(_mm512_permutexvar_ps(hi, t), sv));
}
#elif defined(__AVX2__) && defined(__F16C__)
// fp8 through the f16 converter, as in the AVX-512 branch: a byte interleave with zeros puts
// each code in an f16's top byte (16 codes per load, 8 per conversion).
template <bool E5M2>
KV_QR_INLINE __m256 fp8_8(__m128i c) {
    if (E5M2) return _mm256_cvtph_ps(c);
    return _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(c, 1), _mm_set1_epi16(int16_t(0xbfff))));
}
template <bool E5M2>
inline void fp8_16(const uint8_t* p, float* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), z = _mm_setzero_si128();
    _mm256_storeu_ps(out, fp8_8<E5M2>(_mm_unpacklo_epi8(z, b)));
    _mm256_storeu_ps(out + 8, fp8_8<E5M2>(_mm_unpackhi_epi8(z, b)));
}
template <bool E5M2>
constexpr float kFp8Unit = E5M2 ? 1.0f : 256.0f;
// Four horizontal sums at once, as on AVX-512 (8 instructions for four 8-float vectors).
KV_QR_INLINE __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));  // a02 b02 a13 b13 per lane
    const __m256 cd = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const __m256 u = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))),
                                   _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(ab), _mm256_castps_pd(cd))));  // a b c d per lane
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}
// y[m * ldy + t] = x_m . w_t, four keys per step (D % 8 == 0): the M <= 3 query vectors are
// loaded once per step and each key vector once, so 3 rows x 4 keys (a GQA group of 3) take
// 12 accumulators, 3 queries and a key, AVX2's 16 registers, and one pass over the tile.
template <int M>
void dot_keys(int64_t nk, int64_t D, const float* x, const float* w, float* y, int64_t ldy) {
    int64_t t = 0;
    for (; t + 4 <= nk; t += 4) {
        __m256 acc[M][4];
        for (int m = 0; m < M; ++m)
            for (int k = 0; k < 4; ++k) acc[m][k] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 8) {
            __m256 qv[M];
            for (int m = 0; m < M; ++m) qv[m] = _mm256_loadu_ps(x + m * D + d);
            for (int k = 0; k < 4; ++k) {
                const __m256 kv = _mm256_loadu_ps(w + (t + k) * D + d);
                for (int m = 0; m < M; ++m) acc[m][k] = _mm256_fmadd_ps(qv[m], kv, acc[m][k]);
            }
        }
        for (int m = 0; m < M; ++m) _mm_storeu_ps(y + m * ldy + t, hsum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
    }
    for (; t < nk; ++t)
        for (int m = 0; m < M; ++m) {
            float a = 0.0f;
            for (int64_t d = 0; d < D; ++d) a += x[m * D + d] * w[t * D + d];
            y[m * ldy + t] = a;
        }
}
inline void score_tile(int64_t rows, int64_t nk, int64_t D, const float* x, const float* tile, float* sc) {
    if (D % 8 != 0) {
        for (int64_t r0 = 0; r0 < rows; r0 += 4)
            gemv_dot<float>(int(std::min<int64_t>(4, rows - r0)), nk, D, x + r0 * D, D, tile, D, sc + r0 * kBlock, kBlock);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += 3) {
        switch (std::min<int64_t>(3, rows - r0)) {
            case 1: dot_keys<1>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
            case 2: dot_keys<2>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
            default: dot_keys<3>(nk, D, x + r0 * D, tile, sc + r0 * kBlock, kBlock); break;
        }
    }
}
// y[m * D + c] = sum_t p[m * kBlock + t] * w[t * D + c] for M rows and NV vectors of columns:
// gemv_tile.h's axpy tile (the same products, in key order, from zero) with each weight
// broadcast straight from memory, where the generic tile's 0 + x costs an add on the FMA
// ports per weight and row. The weights' zero signs cannot change a sum: no accumulator that
// starts at +0 becomes -0.
template <int M, int NV>
KV_QR_INLINE void axpy_tile(int64_t nk, int64_t D, const float* p, const float* w, float* y) {
    __m256 acc[M][NV];
    for (int m = 0; m < M; ++m)
        for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_setzero_ps();
    for (int64_t t = 0; t < nk; ++t) {
        __m256 wv[NV];
        for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(w + t * D + 8 * v);
        for (int m = 0; m < M; ++m) {
            const __m256 xs = _mm256_broadcast_ss(p + m * kBlock + t);
            for (int v = 0; v < NV; ++v) acc[m][v] = _mm256_fmadd_ps(xs, wv[v], acc[m][v]);
        }
    }
    for (int m = 0; m < M; ++m)
        for (int v = 0; v < NV; ++v) _mm256_storeu_ps(y + m * D + 8 * v, acc[m][v]);
}
template <int M>
void axpy_rows(int64_t nk, int64_t D, const float* p, const float* w, float* y) {
    constexpr int NV = M < 3 ? 4 : 2;  // accumulators, weights and a broadcast in 16 registers
    int64_t c = 0;
    for (; c + 8 * NV <= D; c += 8 * NV) axpy_tile<M, NV>(nk, D, p, w + c, y + c);
    for (; c < D; c += 8) axpy_tile<M, 1>(nk, D, p, w + c, y + c);
}
// tmp (rows x D) = the rows' weights (sc, rows of kBlock) times the nk value rows of the tile.
inline void weigh_values(int64_t rows, int64_t nk, int64_t D, const float* sc, const float* tile, float* tmp) {
    if (D % 8 != 0) {
        for (int64_t r0 = 0; r0 < rows; r0 += 4)
            gemv_axpy<float>(int(std::min<int64_t>(4, rows - r0)), D, nk, sc + r0 * kBlock, kBlock, tile, D, tmp + r0 * D, D);
        return;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += 3) {
        switch (std::min<int64_t>(3, rows - r0)) {
            case 1: axpy_rows<1>(nk, D, sc + r0 * kBlock, tile, tmp + r0 * D); break;
            case 2: axpy_rows<2>(nk, D, sc + r0 * kBlock, tile, tmp + r0 * D); break;
            default: axpy_rows<3>(nk, D, sc + r0 * kBlock, tile, tmp + r0 * D); break;
        }
    }
}
#define KV_QR_WEIGH 1
// 8 codes (0..15) through a 16-entry table: two 8-entry permutes, picked by bit 3.
inline __m256 lookup16(__m256i idx, __m256 t_lo, __m256 t_hi) {
    const __m256 hi = _mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, _mm256_set1_epi32(7)));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t_lo, idx), _mm256_permutevar8x32_ps(t_hi, idx), hi);
}
// 8 codes of 4 bytes (low nibble first) as 32-bit lanes in element order: a broadcast load
// and a variable shift, no shuffle (the permutes are the lookup's bottleneck port).
KV_QR_INLINE __m256i codes8(const uint8_t* p) {
    int32_t x;
    std::memcpy(&x, p, 4);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(x), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                            _mm256_set1_epi32(15));
}
inline void nib16(const uint8_t* p, const float* tab, float s, float o, float* out) {
    const __m256 t_lo = _mm256_loadu_ps(tab), t_hi = _mm256_loadu_ps(tab + 8), sv = _mm256_set1_ps(s), ov = _mm256_set1_ps(o);
    _mm256_storeu_ps(out, _mm256_fmadd_ps(lookup16(codes8(p), t_lo, t_hi), sv, ov));
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(lookup16(codes8(p + 4), t_lo, t_hi), sv, ov));
}
// Codebook codes (TurboQuant keys: tab[c] * 1 + 0) of n16 runs of 16: half of each run through
// the permutes, half through pair[byte] = both values of a byte, loads that leave the permute
// port to the other half. pair holds the same fmadd(tab[c], 1, 0) values.
inline void cb_nibs(const uint8_t* p, int64_t n16, const float* tab, const uint64_t* pair, float* out) {
    const __m256 t_lo = _mm256_loadu_ps(tab), t_hi = _mm256_loadu_ps(tab + 8), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    for (int64_t b = 0; b < n16; ++b, p += 8, out += 16) {
        _mm256_storeu_ps(out, _mm256_fmadd_ps(lookup16(codes8(p), t_lo, t_hi), one, zero));
        const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair + p[4]));
        const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair + p[5]));
        const __m128i d = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair + p[6]));
        const __m128i e = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(pair + p[7]));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8), _mm_unpacklo_epi64(a, c));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 12), _mm_unpacklo_epi64(d, e));
    }
}
#define KV_QR_PAIRS 1
// Codes that are their own value (tab[c] = c, TurboQuant's uniform values): c * s + o
// converted, no lookup.
inline void unib16(const uint8_t* p, const float*, float s, float o, float* out) {
    const __m256 sv = _mm256_set1_ps(s), ov = _mm256_set1_ps(o);
    _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8(p)), sv, ov));
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8(p + 4)), sv, ov));
}
// E2M1 (FP4) codes: every value is an f16 with a zero low byte, so the 16 top bytes fit one
// register; a byte shuffle looks 16 codes up at once and an interleave with zeros makes the
// f16s for the converter. The same values as the f32 table, so the same products.
KV_QR_INLINE __m128i e2m1_f16_top(__m128i codes) {
    return _mm_shuffle_epi8(_mm_setr_epi8(0x00, 0x38, 0x3c, 0x3e, 0x40, 0x42, 0x44, 0x46, char(0x80), char(0xb8), char(0xbc), char(0xbe),
                                          char(0xc0), char(0xc2), char(0xc4), char(0xc6)),
                            codes);
}
// 16 E2M1 values in element order from their f16 top bytes: 16 floats, times s (plus o: NVFP4
// keeps the fmadd its other variants use, so -0 * s + 0 stays +0).
KV_QR_INLINE void e2m1_store16(__m128i top, __m256 sv, float* out) {
    const __m128i z = _mm_setzero_si128();
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(z, top)), sv));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(z, top)), sv));
}
KV_QR_INLINE void e2m1_fma16(__m128i top, __m256 sv, float* out) {
    const __m128i z = _mm_setzero_si128();
    const __m256 zero = _mm256_setzero_ps();
    _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpacklo_epi8(z, top)), sv, zero));
    _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_unpackhi_epi8(z, top)), sv, zero));
}
// NVFP4: 16 bytes = two blocks of 16 elements, element 2j the low nibble of byte j.
inline void fp4_nib32(const uint8_t* p, const float*, float s0, float s1, float* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    e2m1_fma16(e2m1_f16_top(_mm_unpacklo_epi8(lo, hi)), _mm256_set1_ps(s0), out);
    e2m1_fma16(e2m1_f16_top(_mm_unpackhi_epi8(lo, hi)), _mm256_set1_ps(s1), out + 16);
}
inline void fp4_nib16(const uint8_t* p, const float*, float s, float* out) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    e2m1_fma16(e2m1_f16_top(_mm_unpacklo_epi8(lo, hi)), _mm256_set1_ps(s), out);
}
// MXFP4: element j the low and j + 16 the high nibble of byte j, so no interleave.
inline void split32(const uint8_t* p, const float*, float s, float* out) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), m = _mm_set1_epi8(15);
    const __m256 sv = _mm256_set1_ps(s);
    e2m1_store16(e2m1_f16_top(_mm_and_si128(b, m)), sv, out);
    e2m1_store16(e2m1_f16_top(_mm_and_si128(_mm_srli_epi16(b, 4), m)), sv, out + 16);
}
#else
// The baseline variant: plain loops.
template <bool E5M2>
inline void fp8_16(const uint8_t* p, float* out) {
    for (int i = 0; i < 16; ++i) out[i] = fp8_scalar<E5M2>(p[i]);
}
template <bool E5M2>
constexpr float kFp8Unit = 1.0f;  // a stored value / fp8_16's value of it
inline void nib16(const uint8_t* p, const float* tab, float s, float o, float* out) {
    for (int j = 0; j < 8; ++j) {
        out[2 * j] = tab[p[j] & 15] * s + o;
        out[2 * j + 1] = tab[p[j] >> 4] * s + o;
    }
}
inline void split32(const uint8_t* p, const float* tab, float s, float* out) {
    for (int j = 0; j < 16; ++j) {
        out[j] = tab[p[j] & 15] * s;
        out[j + 16] = tab[p[j] >> 4] * s;
    }
}
#endif
#if !defined(__AVX512F__) && !(defined(__AVX2__) && defined(__F16C__))
// Scores of nk decoded keys for every query row: the decode path's gemv.
inline void score_tile(int64_t rows, int64_t nk, int64_t D, const float* x, const float* tile, float* sc) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4)
        gemv_dot<float>(int(std::min<int64_t>(4, rows - r0)), nk, D, x + r0 * D, D, tile, D, sc + r0 * kBlock, kBlock);
}
#endif
#if !defined(__AVX512F__)
inline void nib32(const uint8_t* p, const float* tab, float s0, float s1, float o, float* out) {
    nib16(p, tab, s0, o, out);
    nib16(p + 8, tab, s1, o, out + 16);
}
#endif
#if !defined(KV_QR_WEIGH)
// tmp (rows x D) = the rows' weights (sc, rows of kBlock) times the nk value rows of the tile.
inline void weigh_values(int64_t rows, int64_t nk, int64_t D, const float* sc, const float* tile, float* tmp) {
    for (int64_t r0 = 0; r0 < rows; r0 += 4)
        gemv_axpy<float>(int(std::min<int64_t>(4, rows - r0)), D, nk, sc + r0 * kBlock, kBlock, tile, D, tmp + r0 * D, D);
}
#endif
#if defined(__AVX512F__) || !(defined(__AVX2__) && defined(__F16C__))
// Elsewhere FP4 and uniform codes take the table lookup (tab holds E2M1 values or the codes).
inline void fp4_nib32(const uint8_t* p, const float* tab, float s0, float s1, float* out) { nib32(p, tab, s0, s1, 0.0f, out); }
inline void fp4_nib16(const uint8_t* p, const float* tab, float s, float* out) { nib16(p, tab, s, 0.0f, out); }
inline void unib16(const uint8_t* p, const float* tab, float s, float o, float* out) { nib16(p, tab, s, o, out); }
inline void unib32(const uint8_t* p, const float* tab, float s, float o, float* out) { nib32(p, tab, s, s, o, out); }
#else
inline void unib32(const uint8_t* p, const float* tab, float s, float o, float* out) {
    unib16(p, tab, s, o, out);
    unib16(p + 8, tab, s, o, out + 16);
}
#endif

// Decodes one stored row of D elements into out (the rotated frame for TurboQuant); returns
// the factor its dot products take (1 where the decoded values already carry every scale).
struct RowDecoder {
    QuantFormat f = QuantFormat::FP8_E4M3;
    int64_t D = 0;
    int bits = 0;
    float tab[16] = {};  // FP4: E2M1 values; TQK: the codebook; TQV: the codes 0..15
    float e4m3[256] = {};  // NVFP4: every E4M3 block scale, so a block's scale is one load
#if defined(KV_QR_PAIRS)
    uint64_t pair[256] = {};  // TQK4 on AVX2: fmadd(tab[lo], 1, 0), fmadd(tab[hi], 1, 0) of each byte
#endif

    RowDecoder(QuantFormat fmt, int64_t d, const float* levels) : f(fmt), D(d), bits(tq_bits(fmt)) {
        for (int i = 0; i < 16; ++i)
            tab[i] = f == QuantFormat::NVFP4 || f == QuantFormat::MXFP4 ? e2m1_to_f32(uint8_t(i)) : tq_codebook(f) ? levels[i] : float(i);
        if (f == QuantFormat::NVFP4)
            for (int i = 0; i < 256; ++i) e4m3[i] = fp8_scalar<false>(uint8_t(i));
#if defined(KV_QR_PAIRS)
        if (tq_codebook(f) && bits == 4)
            for (int i = 0; i < 256; ++i) {
                const float two[2] = {std::fma(tab[i & 15], 1.0f, 0.0f), std::fma(tab[i >> 4], 1.0f, 0.0f)};
                std::memcpy(&pair[i], two, 8);
            }
#endif
    }

    // One row of each kind; decode_rows picks the kind once per block of rows, so each loop
    // below is one inlined body.
    template <bool E5M2>
    KV_QR_INLINE float fp8_row(const uint8_t* r, float* out) const {
        int64_t i = 0;
        for (; i + 16 <= D; i += 16) fp8_16<E5M2>(r + i, out + i);
        for (; i < D; ++i) out[i] = fp8_scalar<E5M2>(r[i]) * (1.0f / kFp8Unit<E5M2>);  // a power of two: exact
        return get_f32(r + D) * kFp8Unit<E5M2>;
    }
    KV_QR_INLINE float nvfp4_row(const uint8_t* r, float* out) const {
        const float sg = get_f32(r + D / 2 + D / 16);
        const uint8_t* sc = r + D / 2;
        int64_t b = 0;
        for (; b + 2 <= D / 16; b += 2) fp4_nib32(r + b * 8, tab, e4m3[sc[b]] * sg, e4m3[sc[b + 1]] * sg, out + b * 16);
        if (b < D / 16) fp4_nib16(r + b * 8, tab, e4m3[sc[b]] * sg, out + b * 16);
        return 1.0f;
    }
    KV_QR_INLINE float mxfp4_row(const uint8_t* r, float* out) const {
        for (int64_t b = 0; b < D / 32; ++b) split32(r + b * 17 + 1, tab, e8m0_to_f32(r[b * 17]), out + b * 32);
        return 1.0f;
    }
    // D 4-bit codes (two per byte, low nibble first): tab[code] * s + o.
    KV_QR_INLINE void nib_row(const uint8_t* r, float s, float o, float* out) const {
        int64_t b = 0;
        for (; b + 2 <= D / 16; b += 2) nib32(r + b * 8, tab, s, s, o, out + b * 16);
        if (b < D / 16) nib16(r + b * 8, tab, s, o, out + b * 16);
    }
    // The same where tab[code] = code (uniform values).
    KV_QR_INLINE void unib_row(const uint8_t* r, float s, float o, float* out) const {
        int64_t b = 0;
        for (; b + 2 <= D / 16; b += 2) unib32(r + b * 8, tab, s, o, out + b * 16);
        if (b < D / 16) unib16(r + b * 8, tab, s, o, out + b * 16);
    }
    KV_QR_INLINE float tq_row(const uint8_t* r, float* out) const {
        const int64_t payload = (D * bits + 7) / 8;
        if (tq_codebook(f)) {  // levels[code] * g
            if (bits == 4) {
#if defined(KV_QR_PAIRS)
                cb_nibs(r, D / 16, tab, pair, out);
#else
                nib_row(r, 1.0f, 0.0f, out);
#endif
            } else {
                for (int64_t i = 0; i < D; ++i) out[i] = tab[tq_get_code(r, i, bits)];
            }
            return get_f32(r + payload);
        }
        const float lo = get_f32(r + payload), s = get_f32(r + payload + 4);  // lo + code * s
        if (bits == 4) {
            unib_row(r, s, lo, out);
        } else if (bits == 8) {
#pragma omp simd
            for (int64_t i = 0; i < D; ++i) out[i] = lo + float(r[i]) * s;
        } else {
            for (int64_t i = 0; i < D; ++i) out[i] = lo + float(tq_get_code(r, i, bits)) * s;
        }
        return 1.0f;
    }

    // nk rows of rb bytes from r into out (nk x D); fac[t] receives row t's factor. Each row
    // prefetches the bytes kPrefetchBytes ahead (one line per row covers rows of up to 64
    // bytes; longer rows leave the rest to the hardware prefetcher): without it the decode
    // waited on its code loads.
    void decode_rows(const uint8_t* r, int64_t rb, int64_t nk, float* out, float* fac) const {
#define KV_QR_ROWS(call)                                                                      \
    for (int64_t t = 0; t < nk; ++t) {                                                        \
        __builtin_prefetch(r + t * rb + kPrefetchBytes, 0, kPrefetchLocality);                \
        if (rb > 64) __builtin_prefetch(r + t * rb + kPrefetchBytes + 64, 0, kPrefetchLocality); \
        fac[t] = call(r + t * rb, out + t * D);                                               \
    }
        switch (f) {
            case QuantFormat::FP8_E4M3: KV_QR_ROWS(fp8_row<false>) return;
            case QuantFormat::FP8_E5M2: KV_QR_ROWS(fp8_row<true>) return;
            case QuantFormat::NVFP4: KV_QR_ROWS(nvfp4_row) return;
            case QuantFormat::MXFP4: KV_QR_ROWS(mxfp4_row) return;
            default: KV_QR_ROWS(tq_row) return;
        }
#undef KV_QR_ROWS
    }
};

// Everything a unit reads.
struct QCall {
    const OpCall* c;
    const RowDecoder *kdec, *vdec;
    int64_t B, NH, n, D, G, R, rows, T, ranges, nblk, rbk, rbv;
    float alpha;
    int window;
    bool rot_k;
    int64_t per_unit;
    float* mem;  // per unit: max, sum, accumulator per row
};

inline void key_range(const QCall& s, int64_t rr, int64_t* t0, int64_t* t1) {
    *t0 = std::min(s.T, (s.nblk * rr / s.ranges) * kBlock);
    *t1 = std::min(s.T, (s.nblk * (rr + 1) / s.ranges) * kBlock);
}

// Per-thread scratch of a unit: its queries, a block's scores, the decoded tile, row factors.
struct UnitScratch {
    float *qs, *sc, *tile, *fac, *tmp;
    int32_t* kp;
    UnitScratch(const QCall& s) {
        qs = scratch<float>(0, s.rows * s.D);
        sc = scratch<float>(1, s.rows * kBlock);
        tile = scratch<float>(2, kBlock * s.D);
        fac = scratch<float>(3, kBlock);
        tmp = scratch<float>(4, s.rows * s.D);
        kp = reinterpret_cast<int32_t*>(scratch<float>(5, kBlock));
    }
};

void prepare_queries(const QCall& s, int64_t b, int64_t g, float* qs) {
    const TensorView& q = s.c->src[0];
    for (int64_t r = 0; r < s.R; ++r)
        for (int64_t i = 0; i < s.n; ++i) {
            float* o = qs + (r * s.n + i) * s.D;
            const float* src = reinterpret_cast<const float*>(q.bytes() + b * q.nb[0] + (g * s.R + r) * q.nb[1] + i * q.nb[2]);
            for (int64_t d = 0; d < s.D; ++d) o[d] = src[d] * s.alpha;
            if (s.rot_k) {  // R q: the rotation the keys were stored with
                for (int64_t d = 0; d < s.D; ++d) o[d] *= tq_sign(d);
                tq_hadamard(o, s.D);
            }
        }
}

// Masked scores of keys [t0, t0 + nk) for every row: sc[row * kBlock + t], -inf where masked.
// Returns false (nothing decoded) when no query sees any key of the block.
bool block_scores(const QCall& s, int64_t b, int64_t g, int64_t t0, int64_t nk, UnitScratch& w) {
    const OpCall& c = *s.c;
    const TensorView &k = c.src[1], &kpos = c.src[3], &qpos = c.src[4];
    const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g, qpb = qpos.ne[0] == 1 ? 0 : b;
    int64_t kmin = INT64_MAX, kmax = INT64_MIN;
    for (int64_t t = 0; t < nk; ++t) {
        w.kp[t] = i32_at(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (t0 + t) * kpos.nb[2]);
        kmin = std::min<int64_t>(kmin, w.kp[t]);
        kmax = std::max<int64_t>(kmax, w.kp[t]);
    }
    bool any = false, all = true;
    for (int64_t i = 0; i < s.n; ++i) {
        const int64_t qp = i32_at(qpos, qpb * qpos.nb[0] + i * qpos.nb[1]);
        const int64_t lo = s.window > 0 ? qp - s.window : INT64_MIN;
        any = any || (kmin <= qp && kmax > lo);
        all = all && kmax <= qp && kmin > lo;
    }
    if (!any) return false;
    const uint8_t* rows = reinterpret_cast<const uint8_t*>(k.bytes() + b * k.nb[0] + g * k.nb[1]) + t0 * s.rbk;
    s.kdec->decode_rows(rows, s.rbk, nk, w.tile, w.fac);
    bool unit_fac = true;
    for (int64_t t = 0; t < nk; ++t) unit_fac = unit_fac && w.fac[t] == 1.0f;
    score_tile(s.rows, nk, s.D, w.qs, w.tile, w.sc);
    if (!unit_fac)
        for (int64_t row = 0; row < s.rows; ++row) {
            float* sr = w.sc + row * kBlock;
#pragma omp simd
            for (int64_t t = 0; t < nk; ++t) sr[t] *= w.fac[t];
        }
    if (all) return true;
    for (int64_t i = 0; i < s.n; ++i) {
        const int64_t qp = i32_at(qpos, qpb * qpos.nb[0] + i * qpos.nb[1]);
        const int64_t lo = s.window > 0 ? qp - s.window : INT64_MIN;
        for (int64_t r = 0; r < s.R; ++r) {
            float* sr = w.sc + (r * s.n + i) * kBlock;
            for (int64_t t = 0; t < nk; ++t)
                if (!(w.kp[t] <= qp && w.kp[t] > lo)) sr[t] = kNegInf;
        }
    }
    return true;
}

void run_unit(const QCall& s, int64_t u) {
    const OpCall& c = *s.c;
    const TensorView& v = c.src[2];
    const int64_t pair = u / s.ranges, rr = u % s.ranges, b = pair / s.G, g = pair % s.G, D = s.D, rows = s.rows;
    float* m = s.mem + u * s.per_unit;
    float* l = m + rows;
    float* acc = l + rows;
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.0f);
    std::fill(acc, acc + rows * D, 0.0f);
    UnitScratch w(s);
    prepare_queries(s, b, g, w.qs);
    int64_t ta, tb;
    key_range(s, rr, &ta, &tb);
    const uint8_t* vbase = reinterpret_cast<const uint8_t*>(v.bytes() + b * v.nb[0] + g * v.nb[1]);
    for (int64_t t0 = ta; t0 < tb; t0 += kBlock) {
        const int64_t nk = std::min(kBlock, tb - t0);
        if (!block_scores(s, b, g, t0, nk, w)) continue;
        // The block's softmax update per row: a new maximum rescales what was accumulated.
        bool seen = false;
        for (int64_t row = 0; row < rows; ++row) {
            float* sr = w.sc + row * kBlock;
            float mt = kNegInf;
#pragma omp simd reduction(max : mt)
            for (int64_t t = 0; t < nk; ++t) mt = sr[t] > mt ? sr[t] : mt;
            if (mt == kNegInf) {
                std::fill(sr, sr + nk, 0.0f);
                continue;
            }
            seen = true;
            if (mt > m[row]) {
                const float corr = online_softmax_scale(m[row], mt);
                l[row] *= corr;
                float* a = acc + row * D;
                for (int64_t d = 0; d < D; ++d) a[d] *= corr;
                m[row] = mt;
            }
            const float mx = m[row];
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t t = 0; t < nk; ++t) {
                sr[t] = kv_exp(sr[t] - mx);  // exp(-inf) = 0
                sum += sr[t];
            }
            l[row] += sum;
        }
        if (!seen) continue;
        const uint8_t* vr = vbase + t0 * s.rbv;
        s.vdec->decode_rows(vr, s.rbv, nk, w.tile, w.fac);
        // A value row's factor (fp8's s) joins its weight: rows x nk products, not nk x D.
        bool unit_fac = true;
        for (int64_t t = 0; t < nk; ++t) unit_fac = unit_fac && w.fac[t] == 1.0f;
        if (!unit_fac)
            for (int64_t row = 0; row < rows; ++row) {
                float* sr = w.sc + row * kBlock;
#pragma omp simd
                for (int64_t t = 0; t < nk; ++t) sr[t] *= w.fac[t];
            }
        weigh_values(rows, nk, D, w.sc, w.tile, w.tmp);
#pragma omp simd
        for (int64_t i = 0; i < rows * D; ++i) acc[i] += w.tmp[i];
    }
}

// Weight sums of a unit's keys with each row's final max and 1 / sum (fin: 2 per row), into
// the unit's own slots of wv (B, G, T).
void run_weights(const QCall& s, int64_t u, const float* fin, float* wv) {
    const int64_t pair = u / s.ranges, rr = u % s.ranges, b = pair / s.G, g = pair % s.G, rows = s.rows;
    UnitScratch w(s);
    prepare_queries(s, b, g, w.qs);
    int64_t ta, tb;
    key_range(s, rr, &ta, &tb);
    const float* fr = fin + pair * rows * 2;
    const float inv_r = 1.0f / float(s.R);
    for (int64_t t0 = ta; t0 < tb; t0 += kBlock) {
        const int64_t nk = std::min(kBlock, tb - t0);
        if (!block_scores(s, b, g, t0, nk, w)) continue;
        float* out = wv + pair * s.T + t0;
        for (int64_t row = 0; row < rows; ++row) {
            if (fr[2 * row + 1] == 0.0f) continue;
            const float M = fr[2 * row], il = fr[2 * row + 1] * inv_r;
            const float* sr = w.sc + row * kBlock;
            for (int64_t t = 0; t < nk; ++t) out[t] += kv_exp(sr[t] - M) * il;
        }
    }
}

}  // namespace

void sdpa_qrows_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &y = c.dst;
    QCall s{};
    s.c = &c;
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.D = q.ne[3], s.G = k.ne[1], s.T = kpos.ne[2];
    s.R = s.NH / s.G, s.rows = s.R * s.n, s.rbk = k.ne[3], s.rbv = v.ne[3];
    s.alpha = c.p.alpha, s.window = c.p.window;
    const QuantFormat kf = QuantFormat(c.p.qformat), vf = QuantFormat(c.p.qformat_v);
    s.rot_k = tq_bits(kf) != 0;
    const RowDecoder kdec(kf, s.D, c.p.qlevels), vdec(vf, s.D, c.p.qlevels);
    s.kdec = &kdec, s.vdec = &vdec;
    const int threads = std::max(1, kernel_threads(ctx));
    const int64_t pairs = s.B * s.G;
    s.nblk = (s.T + kBlock - 1) / kBlock;
    // Ranges only for decode-sized calls (a prefill chunk has query rows enough to share): up
    // to kUnitsPerThread per thread beyond one per pair, so the units' state does not grow with
    // T, and units small enough that a helper preempted on a loaded machine holds little work.
    s.ranges = s.n <= 4 && s.nblk > 0
                   ? std::max<int64_t>(1, std::min<int64_t>(s.nblk, (int64_t(threads) * kUnitsPerThread + pairs - 1) / pairs))
                   : 1;
    const int64_t units = pairs * s.ranges;
    s.per_unit = s.rows * (s.D + 2);
    KernelScratch mem(ctx, size_t(std::max<int64_t>(1, units * s.per_unit)) * sizeof(float));
    s.mem = mem.as<float>();
    const int64_t bytes = pairs * s.T * (s.rbk + s.rbv);
    const int nt = bytes >= kParallelBytes ? int(std::min<int64_t>(threads, units)) : 1;
    run_units(nt, units, [&](int64_t u) { run_unit(s, u); });

    // Merge each pair's ranges in order; keep each row's final max and 1 / sum for the weights.
    std::vector<float> fin(size_t(pairs * s.rows * 2)), out(size_t(s.D)), wm(size_t(s.ranges)), wl(size_t(s.ranges));
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / s.G, g = pair % s.G;
        for (int64_t row = 0; row < s.rows; ++row) {
            for (int64_t rr = 0; rr < s.ranges; ++rr) {
                const float* um = s.mem + (pair * s.ranges + rr) * s.per_unit;
                wm[size_t(rr)] = um[row], wl[size_t(rr)] = um[s.rows + row];
            }
            float M, Ls;
            online_softmax_merge(wm.data(), wl.data(), int(s.ranges), M, Ls);
            std::fill(out.begin(), out.end(), 0.0f);
            for (int64_t rr = 0; rr < s.ranges; ++rr) {
                const float f = online_softmax_scale(wm[size_t(rr)], M);
                if (f == 0.0f) continue;
                const float* a = s.mem + (pair * s.ranges + rr) * s.per_unit + 2 * s.rows + row * s.D;
                for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] += f * a[d];
            }
            const float il = Ls > 0.0f ? 1.0f / Ls : 0.0f;
            for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] *= il;
            if (tq_bits(vf) && il > 0.0f) {  // x = S H y / sqrt(n): back from the rotated frame
                tq_hadamard(out.data(), s.D);
                for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] *= tq_sign(d);
            }
            const int64_t r = row / s.n, i = row % s.n;
            store_row(y.bytes() + b * y.nb[0] + (g * s.R + r) * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, s.D, out.data());
            fin[size_t((pair * s.rows + row) * 2)] = M;
            fin[size_t((pair * s.rows + row) * 2 + 1)] = il;
        }
    }
    if (!c.dst2.data) return;

    // Weight sums: the scores again, weighted by each row's final softmax.
    std::vector<float> wv(size_t(pairs * s.T), 0.0f);
    run_units(nt, units, [&](int64_t u) { run_weights(s, u, fin.data(), wv.data()); });
    for (int64_t pair = 0; pair < pairs; ++pair) {
        const int64_t b = pair / s.G, g = pair % s.G;
        store_row(c.dst2.bytes() + b * c.dst2.nb[0] + g * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, s.T, wv.data() + pair * s.T);
    }
}

}  // namespace kv::cpu
