// SDPA_KIVI on the CPU: attention over a KIVI cache (kernels/common/kivi_math.h) with the
// dequantization fused into the read. Decode calls (n <= 4, f32; head size and group a
// multiple of the vector width) take decode_forward below: scores and values straight from
// the codes, vectorized per kernel variant. Other calls (prefill chunks, f64): a unit is one (batch, KV group, range of slot groups)
// for all R heads of the group; each slot group is decoded once (codes through a byte table,
// then one FMA per element) into an L1-resident K^T / V tile shared by every query of the unit, so no dequantized copy of the cache is ever
// formed. Units keep an online softmax (max, sum, weighted V) per query row; the ranges of a
// pair are merged at the end. Decode splits the keys of a pair into ranges so both cores
// share even one pair. Sink logits (src9, gpt-oss) join each row's max and sum after the
// merge, as in SDPA. Weight sums (dst2) take a second pass with the final max and sum, so
// they carry the sink in their denominator too.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "cpu_common.h"
#include "kernels/common/element_math.h"
#include "kernels/common/kivi_math.h"
#include "kernels/common/online_softmax.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

inline int32_t i32_at(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

struct KiviCall {
    int64_t B, NH, n, D, G, R, T, NG, S, VG, ngT, ranges;
    int bits, window;
    double alpha;
};

// The sink logit of each query head (src9), or empty without sinks.
template <class A>
std::vector<A> kivi_sinks(const OpCall& c, int64_t NH) {
    std::vector<A> sinks;
    if (c.nsrc > 9 && c.src[9].data) {
        sinks.resize(size_t(NH));
        load_row(c.src[9].bytes(), c.src[9].nb[0], c.src[9].dtype, NH, sinks.data());
    }
    return sinks;
}

KiviCall kivi_call(const OpCall& c, int threads) {
    const TensorView &q = c.src[0], &kc = c.src[1], &vs = c.src[4], &kpos = c.src[7];
    KiviCall s{};
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.D = q.ne[3], s.G = kc.ne[1], s.NG = kc.ne[2];
    s.R = s.NH / s.G, s.T = kpos.ne[2], s.S = c.p.kivi_group, s.bits = c.p.kivi_bits, s.VG = s.D / vs.ne[3];
    s.window = c.p.window, s.alpha = c.p.alpha;
    s.ngT = (s.T + s.S - 1) / s.S;
    // Key ranges only for decode-sized calls: a prefill chunk has query rows enough to share.
    const int64_t pairs = s.B * s.G;
    s.ranges = s.n <= 4 ? std::max<int64_t>(1, std::min<int64_t>(s.ngT, (int64_t(threads) * 4 + pairs - 1) / pairs)) : 1;
    if (s.ngT == 0) s.ranges = 1;
    return s;
}

// Codes of a byte, as floats (2-bit: 4 codes, 4-bit: 2 codes, lowest bits first): unpacking
// is a table load instead of shifts and masks per code.
struct CodeTables {
    float c2[256][4];
    float c4[256][2];
    CodeTables() {
        for (int b = 0; b < 256; ++b) {
            for (int i = 0; i < 4; ++i) c2[b][i] = float((b >> (2 * i)) & 3);
            for (int i = 0; i < 2; ++i) c4[b][i] = float((b >> (4 * i)) & 15);
        }
    }
};
const CodeTables& code_tables() {
    static const CodeTables t;
    return t;
}

// n codes (n * bits a multiple of 8) of the byte run p, as floats.
inline void unpack_codes(const uint8_t* p, int64_t n, int bits, float* out) {
    const CodeTables& t = code_tables();
    if (bits == 2) {
        for (int64_t i = 0; i < n / 4; ++i) std::memcpy(out + 4 * i, t.c2[p[i]], 16);
    } else {
        for (int64_t i = 0; i < n / 2; ++i) std::memcpy(out + 2 * i, t.c4[p[i]], 8);
    }
}

// Decode slot group j of pair (b, g): keys transposed, Kt[d * S + t] (scores then run over
// contiguous t for every channel), values V[t * D + d]. Returns the group's slots below T.
template <class A>
int64_t load_group(const OpCall& c, const KiviCall& s, int64_t b, int64_t g, int64_t j, A* Kt, A* V, float* codes) {
    const TensorView &kc = c.src[1], &ks = c.src[2], &vc = c.src[3], &vs = c.src[4], &res = c.src[5], &map = c.src[6];
    const int64_t t0 = j * s.S, nt = std::min(s.S, s.T - t0);
    const int32_t blk = i32_at(map, b * map.nb[0] + g * map.nb[1] + j * map.nb[2]);
    if (blk >= 0) {  // full-precision residual group
        for (int64_t t = 0; t < nt; ++t) {
            load_row(res.bytes() + blk * res.nb[0] + t * res.nb[2], res.nb[3], res.dtype, s.D, V + t * s.D);  // staging
            for (int64_t d = 0; d < s.D; ++d) Kt[d * s.S + t] = V[t * s.D + d];
            load_row(res.bytes() + blk * res.nb[0] + res.nb[1] + t * res.nb[2], res.nb[3], res.dtype, s.D, V + t * s.D);
        }
        return nt;
    }
    const char* kcg = kc.bytes() + b * kc.nb[0] + g * kc.nb[1] + j * kc.nb[2];
    const char* ksg = ks.bytes() + b * ks.nb[0] + g * ks.nb[1] + j * ks.nb[2];
    for (int64_t d = 0; d < s.D; ++d) {
        unpack_codes(reinterpret_cast<const uint8_t*>(kcg + d * kc.nb[3]), s.S, s.bits, codes);
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(ksg + d * ks.nb[3]);
        const float scale = h2f(sc[0]), mn = h2f(sc[1]);
        A* row = Kt + d * s.S;
#pragma omp simd
        for (int64_t t = 0; t < s.S; ++t) row[t] = A(mn + scale * codes[t]);
    }
    for (int64_t t = 0; t < nt; ++t) {
        unpack_codes(reinterpret_cast<const uint8_t*>(vc.bytes() + b * vc.nb[0] + g * vc.nb[1] + (t0 + t) * vc.nb[2]), s.D, s.bits, codes);
        const char* sr = vs.bytes() + b * vs.nb[0] + g * vs.nb[1] + (t0 + t) * vs.nb[2];
        A* row = V + t * s.D;
        for (int64_t vg = 0; vg < s.D / s.VG; ++vg) {
            const uint16_t* sc = reinterpret_cast<const uint16_t*>(sr + vg * vs.nb[3]);
            const float scale = h2f(sc[0]), mn = h2f(sc[1]);
#pragma omp simd
            for (int64_t d = vg * s.VG; d < (vg + 1) * s.VG; ++d) row[d] = A(mn + scale * codes[d]);
        }
    }
    return nt;
}

// Masked, scaled scores of one query row against a tile of nt keys; -inf where invisible.
template <class A>
void tile_scores(const KiviCall& s, const A* qrow, const A* Kt, const int32_t* kp, int64_t nt, int64_t qp, A* out) {
    const int64_t lo = s.window > 0 ? qp - s.window : std::numeric_limits<int64_t>::min();
    for (int64_t t = 0; t < nt; ++t) out[t] = 0;
    for (int64_t d = 0; d < s.D; ++d) {
        const A qd = qrow[d];
        const A* k = Kt + d * s.S;
#pragma omp simd
        for (int64_t t = 0; t < nt; ++t) out[t] += qd * k[t];
    }
    for (int64_t t = 0; t < nt; ++t)
        out[t] = kp[t] <= qp && kp[t] > lo ? A(s.alpha) * out[t] : -std::numeric_limits<A>::infinity();
}

template <class A>
void forward(const OpContext& ctx, const OpCall& c) {
    const int threads = ctx.threads > 0 ? ctx.threads : omp_get_max_threads();
    const KiviCall s = kivi_call(c, threads);
    const TensorView &q = c.src[0], &kpos = c.src[7], &qpos = c.src[8], &y = c.dst;
    const int64_t rows = s.R * s.n;                    // query rows of one pair
    const int64_t units = s.B * s.G * s.ranges;
    const int64_t state = rows * (s.D + 2);            // per unit: max, sum, weighted V
    std::vector<A> st(size_t(units * state));
    std::vector<A> qbuf(size_t(s.B * s.NH * s.n * s.D));
    const std::vector<A> sinks = kivi_sinks<A>(c, s.NH);
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.NH; ++h)
            for (int64_t i = 0; i < s.n; ++i)
                load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, s.D,
                         qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D);
    auto group_range = [&](int64_t r, int64_t* j0, int64_t* j1) {
        *j0 = s.ngT * r / s.ranges;
        *j1 = s.ngT * (r + 1) / s.ranges;
    };
    auto kp_of = [&](int64_t b, int64_t g, int64_t j, int64_t nt, int32_t* kp) {
        const int64_t kb = kpos.ne[0] == 1 ? 0 : b, kg = kpos.ne[1] == 1 ? 0 : g;
        for (int64_t t = 0; t < nt; ++t) kp[t] = i32_at(kpos, kb * kpos.nb[0] + kg * kpos.nb[1] + (j * s.S + t) * kpos.nb[2]);
    };
    auto qp_of = [&](int64_t b, int64_t i) { return int64_t(i32_at(qpos, (qpos.ne[0] == 1 ? 0 : b) * qpos.nb[0] + i * qpos.nb[1])); };

    run_units(threads, units, [&](int64_t u) {
        const int64_t pair = u / s.ranges, r = u % s.ranges, b = pair / s.G, g = pair % s.G;
        A* m = st.data() + u * state;
        A* l = m + rows;
        A* acc = l + rows;
        std::fill(m, m + rows, -std::numeric_limits<A>::infinity());
        std::fill(l, l + rows, A(0));
        std::fill(acc, acc + rows * s.D, A(0));
        std::vector<A> K(size_t(s.S * s.D)), V(size_t(s.S * s.D)), sc(size_t(s.S));
        std::vector<float> codes(size_t(std::max(s.S, s.D)));
        std::vector<int32_t> kp(size_t(s.S));
        int64_t j0, j1;
        group_range(r, &j0, &j1);
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t nt = load_group(c, s, b, g, j, K.data(), V.data(), codes.data());
            kp_of(b, g, j, nt, kp.data());
            for (int64_t row = 0; row < rows; ++row) {
                const int64_t h = g * s.R + row / s.n, i = row % s.n;
                tile_scores(s, qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D, K.data(), kp.data(), nt, qp_of(b, i), sc.data());
                A mb = -std::numeric_limits<A>::infinity();
                for (int64_t t = 0; t < nt; ++t) mb = std::max(mb, sc[size_t(t)]);
                if (mb == -std::numeric_limits<A>::infinity()) continue;
                const A corr = online_softmax_raise(m[row], l[row], mb, LibmExp{});
                A* a = acc + row * s.D;
                for (int64_t d = 0; d < s.D; ++d) a[d] *= corr;
                for (int64_t t = 0; t < nt; ++t) {
                    if (sc[size_t(t)] == -std::numeric_limits<A>::infinity()) continue;
                    const A p = std::exp(sc[size_t(t)] - m[row]);
                    l[row] += p;
                    const A* v = V.data() + t * s.D;
#pragma omp simd
                    for (int64_t d = 0; d < s.D; ++d) a[d] += p * v[d];
                }
            }
        }
    });

    // Merge the ranges of each pair into the output; keep the final max and sum for weights.
    std::vector<A> fin(size_t(s.B * s.G * rows * 2));
    std::vector<A> out(size_t(s.D));
    for (int64_t pair = 0; pair < s.B * s.G; ++pair) {
        const int64_t b = pair / s.G, g = pair % s.G;
        for (int64_t row = 0; row < rows; ++row) {
            const A* m0 = st.data() + pair * s.ranges * state + row;
            A M, L;
            online_softmax_merge(m0, m0 + rows, int(s.ranges), M, L, state, LibmExp{});
            std::fill(out.begin(), out.end(), A(0));
            for (int64_t r = 0; r < s.ranges; ++r) {
                const A* m = st.data() + (pair * s.ranges + r) * state;
                if (m[row] == -std::numeric_limits<A>::infinity()) continue;
                const A f = online_softmax_scale(m[row], M, LibmExp{});
                const A* a = m + 2 * rows + row * s.D;
                for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] += a[d] * f;
            }
            const int64_t h = g * s.R + row / s.n, i = row % s.n;
            // The sink joins the merged max and sum (it has no value); a row that sees no slot
            // keeps zeros.
            const A f = sinks.empty() ? A(1) : online_softmax_sink(M, L, sinks[size_t(h)], LibmExp{});
            for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] = L > 0 ? out[size_t(d)] * f / L : A(0);
            store_row(y.bytes() + b * y.nb[0] + h * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, s.D, out.data());
            fin[size_t((pair * rows + row) * 2)] = M;
            fin[size_t((pair * rows + row) * 2 + 1)] = L;
        }
    }
    if (!c.dst2.data) return;

    const TensorView& w = c.dst2;
    run_units(threads, units, [&](int64_t u) {
        const int64_t pair = u / s.ranges, r = u % s.ranges, b = pair / s.G, g = pair % s.G;
        std::vector<A> K(size_t(s.S * s.D)), V(size_t(s.S * s.D)), sc(size_t(s.S)), ws(size_t(s.S));
        std::vector<float> codes(size_t(std::max(s.S, s.D)));
        std::vector<int32_t> kp(size_t(s.S));
        int64_t j0, j1;
        group_range(r, &j0, &j1);
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t nt = load_group(c, s, b, g, j, K.data(), V.data(), codes.data());
            kp_of(b, g, j, nt, kp.data());
            std::fill(ws.begin(), ws.end(), A(0));
            for (int64_t row = 0; row < rows; ++row) {
                const A M = fin[size_t((pair * rows + row) * 2)], L = fin[size_t((pair * rows + row) * 2 + 1)];
                if (!(L > 0)) continue;
                const int64_t h = g * s.R + row / s.n, i = row % s.n;
                tile_scores(s, qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D, K.data(), kp.data(), nt, qp_of(b, i), sc.data());
                for (int64_t t = 0; t < nt; ++t)
                    if (sc[size_t(t)] != -std::numeric_limits<A>::infinity()) ws[size_t(t)] += std::exp(sc[size_t(t)] - M) / L;
            }
            for (int64_t t = 0; t < nt; ++t) ws[size_t(t)] /= A(s.R);
            store_row(w.bytes() + b * w.nb[0] + g * w.nb[1] + j * s.S * w.nb[2], w.nb[2], w.dtype, nt, ws.data());
        }
    });
}


// =========================================================================================
// Decode (n <= 4 queries): scores and values straight from the codes, no dequantized tile.
// =========================================================================================
// Keys, per group and channel d: q.k_t = sum_d (q_d s_d) c_td + sum_d q_d m_d, so the scale
// is folded into q once per (group, channel) and the minima into one constant per row; the
// S codes of a channel are unpacked a vector of tokens at a time (shift per lane, mask,
// convert) and feed one FMA per query row. Values, per token: v_d = m_g + s_g c_d is formed a
// vector of channels at a time and accumulated as p_t v_d into register tiles. A unit is
// (pair, kDecodeUnitKeys keys): its own max, sum and accumulator, merged in unit order, so
// results do not depend on the thread count. Scratch comes from the op workspace.
constexpr int64_t kDecodeUnitKeys = 512;
constexpr int64_t kDecodeParallelKeys = 4096;  // pair-keys below which one thread runs

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using VF = __m512;
inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset1(float x) { return _mm512_set1_ps(x); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
// 16 consecutive codes starting at byte p (lane i: code i). GCC vector types rather than the
// AVX-512 shift and convert intrinsics, whose _mm512_undefined operands GCC 12 reports as
// maybe-uninitialized under -Werror; the instructions are the same (vpsrlvd, vcvtdq2ps).
using U32x16 = uint32_t __attribute__((vector_size(64)));
using I32x16 = int32_t __attribute__((vector_size(64)));
using F32x16 = float __attribute__((vector_size(64)));
template <int BITS>
inline VF vcodes(const uint8_t* p) {
    U32x16 x = {};
    if constexpr (BITS == 2) {
        uint32_t w;
        std::memcpy(&w, p, 4);
        x += w;
        x >>= U32x16{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    } else {
        uint32_t w[2];
        std::memcpy(w, p, 8);
        const U32x16 hi = {0, 0, 0, 0, 0, 0, 0, 0, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u};
        x += w[0];
        x += (w[1] - w[0]) & hi;  // lanes 8..15: the second word
        x >>= U32x16{0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28};
    }
    x &= uint32_t((1 << BITS) - 1);
    return VF(__builtin_convertvector(I32x16(x), F32x16));
}
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
using VF = __m256;
inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset1(float x) { return _mm256_set1_ps(x); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
template <int BITS>
inline VF vcodes(const uint8_t* p) {
    uint32_t w = 0;
    std::memcpy(&w, p, BITS);  // 8 codes: 2 bytes (2-bit) or 4 bytes (4-bit)
    const __m256i sh = BITS == 2 ? _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14) : _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(w)), sh), _mm256_set1_epi32((1 << BITS) - 1)));
}
#else
// Portable lanes (the base variant): plain arrays the compiler may vectorize.
constexpr int kLanes = 8;
struct VF {
    float v[8];
};
inline VF vzero() { return VF{}; }
inline VF vset1(float x) {
    VF r;
    for (int i = 0; i < 8; ++i) r.v[i] = x;
    return r;
}
inline VF vfma(VF a, VF b, VF c) {
    for (int i = 0; i < 8; ++i) c.v[i] = a.v[i] * b.v[i] + c.v[i];
    return c;
}
inline VF vload(const float* p) {
    VF r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
}
inline void vstore(float* p, VF v) { std::memcpy(p, v.v, sizeof v.v); }
template <int BITS>
inline VF vcodes(const uint8_t* p) {
    VF r;
    for (int i = 0; i < 8; ++i) r.v[i] = float((p[i * BITS / 8] >> ((i * BITS) % 8)) & ((1 << BITS) - 1));
    return r;
}
#endif

// n f16 values (scales and minima) to f32, 8 at a time where the CPU has F16C.
inline void f16_row(const uint16_t* src, int64_t n, float* dst) {
    int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) dst[i] = h2f(src[i]);
}

bool kivi_decode_applies(const OpCall& c, const KiviCall& s) {
    return !is_f64_call(c) && s.n >= 1 && s.n <= 4 && s.R >= 1 && s.D % kLanes == 0 && s.S % kLanes == 0 && s.VG % kLanes == 0 &&
           s.T > 0;
}

// Scores of NR query rows against the S tokens of a packed key group: sc[r * ldsc + t].
// qa[r * 2D + 2d] = q_rd s_d, qm[r] = sum_d q_rd m_d (the rows' block starts at r0).
template <int BITS, int NR>
inline void group_scores(const uint8_t* codes, int64_t S, int64_t D, const float* qa, int64_t rows, int64_t r0, const float* qm,
                         float* sc, int64_t ldsc) {
    const int64_t rb = S * BITS / 8;
    for (int64_t tc = 0; tc < S; tc += kLanes) {
        VF acc[NR];
        for (int r = 0; r < NR; ++r) acc[r] = vset1(qm[r0 + r]);
        const uint8_t* p = codes + tc * BITS / 8;
        for (int64_t d = 0; d < D; ++d, p += rb) {
            const VF cv = vcodes<BITS>(p);
            for (int r = 0; r < NR; ++r) acc[r] = vfma(vset1(qa[(r0 + r) * 2 * D + 2 * d]), cv, acc[r]);
        }
        for (int r = 0; r < NR; ++r) vstore(sc + (r0 + r) * ldsc + tc, acc[r]);
    }
}

// acc[r * D + d] += sum_t P[r * ldp + t] v_td over nt packed value rows (row stride vstride
// bytes of codes, sstride bytes of scales), for the NR rows starting at r0, DV vectors of
// channels at a time starting at channel d0.
template <int BITS, int NR, int DV>
inline void group_values(const char* vcodes0, int64_t vstride, const float* vsf, int64_t sstride, int64_t nt, int64_t VG,
                         const float* P, int64_t ldp, int64_t r0, int64_t d0, float* acc, int64_t D) {
    VF a[NR][DV];
    for (int r = 0; r < NR; ++r)
        for (int k = 0; k < DV; ++k) a[r][k] = vload(acc + (r0 + r) * D + d0 + k * kLanes);
    for (int64_t t = 0; t < nt; ++t) {
        const uint8_t* cp = reinterpret_cast<const uint8_t*>(vcodes0 + t * vstride);
        const float* sp = vsf + t * sstride;
        VF v[DV];
        for (int k = 0; k < DV; ++k) {
            const int64_t d = d0 + k * kLanes, vg = d / VG;
            v[k] = vfma(vset1(sp[2 * vg]), vcodes<BITS>(cp + d * BITS / 8), vset1(sp[2 * vg + 1]));
        }
        for (int r = 0; r < NR; ++r) {
            const VF pr = vset1(P[(r0 + r) * ldp + t]);
            for (int k = 0; k < DV; ++k) a[r][k] = vfma(pr, v[k], a[r][k]);
        }
    }
    for (int r = 0; r < NR; ++r)
        for (int k = 0; k < DV; ++k) vstore(acc + (r0 + r) * D + d0 + k * kLanes, a[r][k]);
}

template <int BITS, int DV>
void values_rows(const char* vcodes0, int64_t vstride, const float* vscales0, int64_t sstride, int64_t nt, int64_t VG, const float* P,
                 int64_t ldp, int64_t rows, int64_t d0, float* acc, int64_t D) {
    int64_t r0 = 0;
    for (; r0 + 4 <= rows; r0 += 4) group_values<BITS, 4, DV>(vcodes0, vstride, vscales0, sstride, nt, VG, P, ldp, r0, d0, acc, D);
    switch (rows - r0) {
        case 3: group_values<BITS, 3, DV>(vcodes0, vstride, vscales0, sstride, nt, VG, P, ldp, r0, d0, acc, D); break;
        case 2: group_values<BITS, 2, DV>(vcodes0, vstride, vscales0, sstride, nt, VG, P, ldp, r0, d0, acc, D); break;
        case 1: group_values<BITS, 1, DV>(vcodes0, vstride, vscales0, sstride, nt, VG, P, ldp, r0, d0, acc, D); break;
        default: break;
    }
}

template <int BITS>
void decode_forward(const OpContext& ctx, const OpCall& c, const KiviCall& s) {
    const TensorView &q = c.src[0], &kc = c.src[1], &ks = c.src[2], &vc = c.src[3], &vs = c.src[4], &res = c.src[5], &map = c.src[6],
                     &kpos = c.src[7], &qpos = c.src[8], &y = c.dst;
    const bool weights = c.dst2.data != nullptr;
    const int64_t D = s.D, S = s.S, T = s.T, n = s.n, rows = s.R * n, pairs = s.B * s.G;
    const int64_t gpu = std::max<int64_t>(1, kDecodeUnitKeys / S), UK = gpu * S;  // groups and keys per unit
    const int64_t nsplit = (s.ngT + gpu - 1) / gpu, units = pairs * nsplit;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // Per unit: m (rows), l (rows), acc (rows, D), P (rows, UK).
    const int64_t per_unit = rows * (2 + D) + rows * UK;
    KernelScratch mem(ctx, size_t(units * per_unit) * sizeof(float));

    auto run_unit = [&](int64_t u) {
        const int64_t p = u / nsplit, j0 = (u % nsplit) * gpu, j1 = std::min(s.ngT, j0 + gpu);
        const int64_t b = p / s.G, g = p % s.G, t0 = j0 * S, nk = std::min(T, j1 * S) - t0;
        float* um = mem.as<float>() + u * per_unit;
        float* ul = um + rows;
        float* acc = ul + rows;
        float* P = acc + rows * D;
        const int64_t NVG = D / s.VG;
        // q rows (alpha folded in); q duplicated per (scale, min) pair and q on the minima's
        // lanes only; q s per channel; sum q m per row; one residual row; a group's scales.
        float* qs = scratch<float>(0, rows * D + 3 * rows * 2 * D + rows + D + 2 * D + S * 2 * NVG);
        float* qd = qs + rows * D;
        float* qo = qd + rows * 2 * D;
        float* qa = qo + rows * 2 * D;
        float* qm = qa + rows * 2 * D;
        float* rowbuf = qm + rows;
        float* ksf = rowbuf + D;
        float* vsf = ksf + 2 * D;
        int32_t* kp = reinterpret_cast<int32_t*>(scratch<float>(1, UK));
        for (int64_t r = 0; r < s.R; ++r)
            for (int64_t i = 0; i < n; ++i) {
                float* qr = qs + (r * n + i) * D;
                load_row(q.bytes() + b * q.nb[0] + (g * s.R + r) * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, D, qr);
                for (int64_t d = 0; d < D; ++d) qr[d] *= float(s.alpha);
            }
        for (int64_t row = 0; row < rows; ++row)
            for (int64_t d = 0; d < D; ++d) {
                qd[row * 2 * D + 2 * d] = qd[row * 2 * D + 2 * d + 1] = qs[row * D + d];
                qo[row * 2 * D + 2 * d] = 0.0f;
                qo[row * 2 * D + 2 * d + 1] = qs[row * D + d];
            }
        const char* kcp = kc.bytes() + b * kc.nb[0] + g * kc.nb[1];
        const char* ksp = ks.bytes() + b * ks.nb[0] + g * ks.nb[1];
        const char* vcp = vc.bytes() + b * vc.nb[0] + g * vc.nb[1];
        const char* vsp = vs.bytes() + b * vs.nb[0] + g * vs.nb[1];
        // Scores into P.
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t tt = (j - j0) * S, ntj = std::min(S, T - j * S);
            const int32_t blk = i32_at(map, b * map.nb[0] + g * map.nb[1] + j * map.nb[2]);
            if (blk >= 0) {  // full-precision residual group
                for (int64_t t = 0; t < ntj; ++t) {
                    load_row(res.bytes() + blk * res.nb[0] + t * res.nb[2], res.nb[3], res.dtype, D, rowbuf);
                    for (int64_t row = 0; row < rows; ++row) {
                        const float* qr = qs + row * D;
                        float dot = 0;
#pragma omp simd reduction(+ : dot)
                        for (int64_t d = 0; d < D; ++d) dot += qr[d] * rowbuf[d];
                        P[row * UK + tt + t] = dot;
                    }
                }
                continue;
            }
            // Fold the group's per-channel scales into q and its minima into one sum per row.
            f16_row(reinterpret_cast<const uint16_t*>(ksp + j * ks.nb[2]), 2 * D, ksf);
            for (int64_t row = 0; row < rows; ++row) {
                const float* a = qd + row * 2 * D;
                const float* o = qo + row * 2 * D;
                float* out = qa + row * 2 * D;
                float m = 0;
#pragma omp simd reduction(+ : m)
                for (int64_t i = 0; i < 2 * D; ++i) {
                    out[i] = a[i] * ksf[i];
                    m += o[i] * ksf[i];
                }
                qm[row] = m;
            }
            const uint8_t* codes = reinterpret_cast<const uint8_t*>(kcp + j * kc.nb[2]);
            int64_t r0 = 0;
            for (; r0 + 4 <= rows; r0 += 4) group_scores<BITS, 4>(codes, S, D, qa, rows, r0, qm, P + tt, UK);
            switch (rows - r0) {
                case 3: group_scores<BITS, 3>(codes, S, D, qa, rows, r0, qm, P + tt, UK); break;
                case 2: group_scores<BITS, 2>(codes, S, D, qa, rows, r0, qm, P + tt, UK); break;
                case 1: group_scores<BITS, 1>(codes, S, D, qa, rows, r0, qm, P + tt, UK); break;
                default: break;
            }
        }
        // Mask by position (skipped when every query sees every key of the unit).
        const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g, qpb = qpos.ne[0] == 1 ? 0 : b;
        int64_t kmin = INT64_MAX, kmax = INT64_MIN;
        for (int64_t t = 0; t < nk; ++t) {
            kp[t] = i32_at(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (t0 + t) * kpos.nb[2]);
            kmin = std::min<int64_t>(kmin, kp[t]);
            kmax = std::max<int64_t>(kmax, kp[t]);
        }
        for (int64_t i = 0; i < n; ++i) {
            const int64_t qp = i32_at(qpos, qpb * qpos.nb[0] + i * qpos.nb[1]);
            const int64_t lo = s.window > 0 ? qp - s.window : INT64_MIN;
            if (kmax <= qp && kmin > lo) continue;
            for (int64_t r = 0; r < s.R; ++r) {
                float* pr = P + (r * n + i) * UK;
                for (int64_t t = 0; t < nk; ++t)
                    if (!(kp[t] <= qp && kp[t] > lo)) pr[t] = neg_inf;
            }
        }
        // The unit's softmax partials.
        for (int64_t row = 0; row < rows; ++row) {
            float* pr = P + row * UK;
            float mb = neg_inf;
            for (int64_t t = 0; t < nk; ++t) mb = std::max(mb, pr[t]);
            um[row] = mb;
            float lsum = 0;
            if (mb == neg_inf) {
                std::fill(pr, pr + nk, 0.0f);
            } else {
#pragma omp simd reduction(+ : lsum)
                for (int64_t t = 0; t < nk; ++t) {
                    pr[t] = kv_exp(pr[t] - mb);
                    lsum += pr[t];
                }
            }
            ul[row] = lsum;
        }
        // acc = P V.
        std::fill(acc, acc + rows * D, 0.0f);
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t tt = (j - j0) * S, ntj = std::min(S, T - j * S);
            const int32_t blk = i32_at(map, b * map.nb[0] + g * map.nb[1] + j * map.nb[2]);
            if (blk >= 0) {
                for (int64_t t = 0; t < ntj; ++t) {
                    load_row(res.bytes() + blk * res.nb[0] + res.nb[1] + t * res.nb[2], res.nb[3], res.dtype, D, rowbuf);
                    for (int64_t row = 0; row < rows; ++row) {
                        const float pt = P[row * UK + tt + t];
                        float* a = acc + row * D;
#pragma omp simd
                        for (int64_t d = 0; d < D; ++d) a[d] += pt * rowbuf[d];
                    }
                }
                continue;
            }
            const char* c0 = vcp + j * S * vc.nb[2];
            const char* s0 = vsp + j * S * vs.nb[2];
            if (vs.nb[2] == 4 * NVG) {
                f16_row(reinterpret_cast<const uint16_t*>(s0), ntj * 2 * NVG, vsf);
            } else {
                for (int64_t t = 0; t < ntj; ++t) f16_row(reinterpret_cast<const uint16_t*>(s0 + t * vs.nb[2]), 2 * NVG, vsf + t * 2 * NVG);
            }
            int64_t d0 = 0;
            for (; d0 + 4 * kLanes <= D; d0 += 4 * kLanes) values_rows<BITS, 4>(c0, vc.nb[2], vsf, 2 * NVG, ntj, s.VG, P + tt, UK, rows, d0, acc, D);
            for (; d0 < D; d0 += kLanes) values_rows<BITS, 1>(c0, vc.nb[2], vsf, 2 * NVG, ntj, s.VG, P + tt, UK, rows, d0, acc, D);
        }
    };
    const int threads = kernel_threads(ctx);
    const int nt = pairs * T >= kDecodeParallelKeys ? int(std::min<int64_t>(std::max(1, threads), units)) : 1;
    run_units(nt, units, run_unit);

    // Merge the units of each pair in order; then y and, with weights, the weight sums.
    const std::vector<float> sinks = kivi_sinks<float>(c, s.NH);
    float* out = scratch<float>(2, D + (weights ? T : 0) + 2 * rows);
    float* wsum = out + D;
    float* m = wsum + (weights ? T : 0);
    float* inv_l = m + rows;
    for (int64_t p = 0; p < pairs; ++p) {
        const int64_t b = p / s.G, g = p % s.G;
        const float* base = mem.as<float>() + p * nsplit * per_unit;
        for (int64_t row = 0; row < rows; ++row) {
            float mx, l;
            online_softmax_merge(base + row, base + rows + row, int(nsplit), mx, l, per_unit);
            std::fill(out, out + D, 0.0f);
            for (int64_t sp = 0; sp < nsplit; ++sp) {
                const float* um = base + sp * per_unit;
                if (um[row] == neg_inf) continue;
                const float f = online_softmax_scale(um[row], mx);
                const float* a = um + 2 * rows + row * D;
                for (int64_t d = 0; d < D; ++d) out[d] += f * a[d];
            }
            const int64_t r = row / n, i = row % n;
            const float f = sinks.empty() ? 1.0f : online_softmax_sink(mx, l, sinks[size_t(g * s.R + r)]);
            const float il = l > 0.0f ? f / l : 0.0f;
            for (int64_t d = 0; d < D; ++d) out[d] *= il;
            m[row] = mx;
            inv_l[row] = l > 0.0f ? 1.0f / l : 0.0f;
            store_row(y.bytes() + b * y.nb[0] + (g * s.R + r) * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, D, out);
        }
        if (!weights) continue;
        std::fill(wsum, wsum + T, 0.0f);
        const float inv_r = 1.0f / float(s.R);
        for (int64_t sp = 0; sp < nsplit; ++sp) {
            const float* um = base + sp * per_unit;
            const float* P = um + rows * (2 + D);
            const int64_t t0 = sp * UK, nk = std::min(UK, T - t0);
            for (int64_t row = 0; row < rows; ++row) {
                if (um[row] == neg_inf || inv_l[row] == 0.0f) continue;
                const float f = online_softmax_scale(um[row], m[row]) * inv_l[row] * inv_r;
                const float* pr = P + row * UK;
#pragma omp simd
                for (int64_t t = 0; t < nk; ++t) wsum[t0 + t] += f * pr[t];
            }
        }
        store_row(c.dst2.bytes() + b * c.dst2.nb[0] + g * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, T, wsum);
    }
}

}  // namespace

void sdpa_kivi_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) return forward<double>(ctx, c);
    const KiviCall s = kivi_call(c, 1);
    if (kivi_decode_applies(c, s)) return s.bits == 2 ? decode_forward<2>(ctx, c, s) : decode_forward<4>(ctx, c, s);
    forward<float>(ctx, c);
}

}  // namespace kv::cpu
