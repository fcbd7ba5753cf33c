// expected-attention's per-key terms (see policy_expected_attention_math.h).
#include "engine/kv/policies/policy_expected_attention_math.h"

#include <algorithm>
#include <cstring>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

// GCC vectors per level (policy_vec.h): an f32 vector V, its half H, and the f64 vector VD of
// V's byte width (half of V's lanes). Used only inside functions built for their level; bodies
// are KV_POLICY_VEC_INLINE.

KV_POLICY_VEC_INLINE double lane_tree(const double l[8]) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// lane_tree of 4 rows of 8 lanes (row r at l + 8 r) at once, out[r] = scale * tree(row r): the
// same additions in the same grouping, done on vectors by transposing in three steps (pairs,
// then pairs of pairs, then the two halves) instead of 4 x 7 scalar adds and their extracts.
KV_POLICY_VEC_INLINE void lane_tree4(const double* l, double scale, double* out) {
    f64x8 a[4];
    std::memcpy(a, l, sizeof(a));
    const f64x8 s01 = __builtin_shufflevector(a[0], a[1], 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(a[0], a[1], 1, 3, 5, 7, 9, 11, 13, 15);
    const f64x8 s23 = __builtin_shufflevector(a[2], a[3], 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(a[2], a[3], 1, 3, 5, 7, 9, 11, 13, 15);
    // u = per row ((l0 + l1) + (l2 + l3)), ((l4 + l5) + (l6 + l7))
    const f64x8 u = __builtin_shufflevector(s01, s23, 0, 2, 4, 6, 8, 10, 12, 14) + __builtin_shufflevector(s01, s23, 1, 3, 5, 7, 9, 11, 13, 15);
    const f64x4 r = (__builtin_shufflevector(u, u, 0, 2, 4, 6) + __builtin_shufflevector(u, u, 1, 3, 5, 7)) * scale;
    std::memcpy(out, &r, sizeof(r));
}

#define KV_EA_ARGS                                                                                                                    \
    int64_t T, int64_t D, int64_t R, const float *K, int64_t ldk, const float *U, int64_t ldu, const double *M, double *lin, \
        double *quad
#define KV_EA_PASS T, D, R, K, ldk, U, ldu, M, lin, quad

// The specification of every sum's order (header); also the path for D not a multiple of the
// vector width.
void key_forms_plain(KV_EA_ARGS) {
    for (int64_t j = 0; j < T; ++j) {
        const float* k = K + j * ldk;
        for (int64_t h = 0; h < R; ++h) {
            double ll[8] = {};
            for (int64_t d = 0; d < D; ++d) ll[d % 8] += double(k[d]) * M[h * D + d];
            lin[h * T + j] = lane_tree(ll);
            if (!quad) continue;
            double lq[8] = {};
            for (int64_t e = 0; e < D; ++e) {
                float t = 0;
                for (int64_t d = 0; d <= e; ++d) t += k[d] * U[d * ldu + h * D + e];
                lq[e % 8] += double(k[e]) * double(t);
            }
            quad[h * T + j] = 2.0 * lane_tree(lq);
        }
    }
}

// MR keys [i0, i0 + MR) against every head. Columns go in groups of NC vectors (NC W columns
// from c0); vector v of a group needs the rows d < c0 + (v + 1) W only (the rest of U's column is
// the zero lower triangle), so the group's own rows run in NC segments, segment s feeding the
// vectors v >= s. The vectors' partial sums t are then dotted with the keys (and the keys with M)
// in f64, lane e mod 8. Extra rows d > e that a vector does take add k_d * 0 = +-0 to t_e: the
// same value as the plain loop's.
template <class V, class H, class VD, int MR, int NC, bool Q>
KV_POLICY_VEC_INLINE void key_forms_rows(int64_t i0, KV_EA_ARGS) {
    constexpr int W = int(sizeof(V) / sizeof(float)), WD = W / 2, NL = 8 / WD;
    static_assert(2 * sizeof(H) == sizeof(V) && sizeof(VD) == sizeof(V) && NL * WD == 8, "vector types of one level");
    // a broadcast as x * 1 (exact; folds to the broadcast alone): V{} + x would keep a scalar
    // add of 0, which signed zeros forbid dropping (0 + -0 is +0)
    constexpr V kOne = V{} + 1.0f;
    for (int64_t h = 0; h < R; ++h) {
        const float* Uh = U + h * D;
        const double* Mh = M + h * D;
        KV_VEC_LOCAL VD ql[MR][NL] = {};
        KV_VEC_LOCAL VD qq[MR][NL] = {};
        for (int64_t c0 = 0; c0 < D; c0 += NC * W) {
            KV_VEC_LOCAL V t[MR][NC] = {};
            if constexpr (Q) {
                for (int64_t d = 0; d < c0; ++d) {  // rows above the group: every column of it
                    KV_VEC_LOCAL V b[NC];
                    for (int v = 0; v < NC; ++v) std::memcpy(&b[v], Uh + d * ldu + c0 + v * W, sizeof(V));
                    for (int r = 0; r < MR; ++r) {
                        const V a = K[(i0 + r) * ldk + d] * kOne;
                        for (int v = 0; v < NC; ++v) t[r][v] += a * b[v];
                    }
                }
#pragma GCC unroll 4
                for (int s = 0; s < NC; ++s)
                    for (int64_t d = c0 + s * W; d < c0 + (s + 1) * W; ++d) {
                        KV_VEC_LOCAL V b[NC];
                        for (int v = s; v < NC; ++v) std::memcpy(&b[v], Uh + d * ldu + c0 + v * W, sizeof(V));
                        for (int r = 0; r < MR; ++r) {
                            const V a = K[(i0 + r) * ldk + d] * kOne;
                            for (int v = s; v < NC; ++v) t[r][v] += a * b[v];
                        }
                    }
            }
            // lane of column e0 = c0 + v W + i WD is (e0 mod 8) / WD; c0 mod 8 is 0 whenever a
            // group's width is a multiple of 8, so the index folds to a constant
            const int64_t cm = (NC * W) % 8 == 0 ? 0 : c0 % 8;
            for (int r = 0; r < MR; ++r)
                for (int v = 0; v < NC; ++v) {
                    KV_VEC_LOCAL H kh[2];
                    KV_VEC_LOCAL H th[2];
                    std::memcpy(kh, K + (i0 + r) * ldk + c0 + v * W, sizeof(V));
                    std::memcpy(th, &t[r][v], sizeof(V));
                    for (int i = 0; i < 2; ++i) {
                        const int64_t li = ((cm + v * W + i * WD) % 8) / WD;
                        const VD kd = __builtin_convertvector(kh[i], VD);
                        VD m;
                        std::memcpy(&m, Mh + c0 + v * W + i * WD, sizeof(VD));
                        ql[r][li] += kd * m;
                        if constexpr (Q) qq[r][li] += kd * __builtin_convertvector(th[i], VD);
                    }
                }
        }
        if constexpr (MR == 4) {  // rows i0..i0+3 are contiguous in lin and quad
            static_assert(sizeof(ql) == 4 * 8 * sizeof(double), "4 rows of 8 lanes");
            lane_tree4(reinterpret_cast<const double*>(ql), 1.0, lin + h * T + i0);
            if constexpr (Q) lane_tree4(reinterpret_cast<const double*>(qq), 2.0, quad + h * T + i0);
            continue;
        }
        for (int r = 0; r < MR; ++r) {
            KV_VEC_LOCAL double l[8];
            std::memcpy(l, ql[r], sizeof(l));
            lin[h * T + i0 + r] = lane_tree(l);
            if constexpr (Q) {
                std::memcpy(l, qq[r], sizeof(l));
                quad[h * T + i0 + r] = 2.0 * lane_tree(l);
            }
        }
    }
}

template <class V, class H, class VD, int NC, bool Q>
KV_POLICY_VEC_INLINE void key_forms_nc(KV_EA_ARGS) {
    constexpr int64_t MR = 4;
    const int64_t T4 = T - T % MR;
    for (int64_t i0 = 0; i0 < T4; i0 += MR) key_forms_rows<V, H, VD, MR, NC, Q>(i0, KV_EA_PASS);
    for (int64_t i0 = T4; i0 < T; ++i0) key_forms_rows<V, H, VD, 1, NC, Q>(i0, KV_EA_PASS);
}

// NCMAX vectors per group where D allows it (AVX-512: 4 x 4 accumulators of 32 registers; the
// 16-register levels: 4 x 2), else fewer.
template <class V, class H, class VD, int NCMAX>
KV_POLICY_VEC_INLINE void key_forms_body(KV_EA_ARGS) {
    constexpr int64_t W = int64_t(sizeof(V) / sizeof(float));
    if (D % W != 0) return key_forms_plain(KV_EA_PASS);
    const bool q = quad != nullptr;
    if (D % (NCMAX * W) == 0) return q ? key_forms_nc<V, H, VD, NCMAX, true>(KV_EA_PASS) : key_forms_nc<V, H, VD, NCMAX, false>(KV_EA_PASS);
    if constexpr (NCMAX > 2)
        if (D % (2 * W) == 0) return q ? key_forms_nc<V, H, VD, 2, true>(KV_EA_PASS) : key_forms_nc<V, H, VD, 2, false>(KV_EA_PASS);
    q ? key_forms_nc<V, H, VD, 1, true>(KV_EA_PASS) : key_forms_nc<V, H, VD, 1, false>(KV_EA_PASS);
}

// S2 += X^T X on the blocks of 2 vectors of columns [c0, c0 + 2W) down to their last row, in
// register tiles of 4 rows x 2 vectors: each entry one sum over t ascending (mul, then add), then
// added to S2, as policy_matmul gives it.
void moments_plain(int64_t m, int64_t D, const double* X, double* S2) {
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = d; e < D; ++e) {
            double sum = 0;
            for (int64_t t = 0; t < m; ++t) sum += X[t * D + d] * X[t * D + e];
            S2[d * D + e] = S2[d * D + e] + sum;
        }
}

template <class VD>
KV_POLICY_VEC_INLINE void moments_body(int64_t m, int64_t D, const double* X, double* S2) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), MR = 4;
    if (D % (2 * W) != 0) return moments_plain(m, D, X, S2);
    constexpr VD kOne = VD{} + 1.0;  // a broadcast as x * 1 (see key_forms_rows)
    for (int64_t c0 = 0; c0 < D; c0 += 2 * W)
        for (int64_t d0 = 0; d0 < c0 + 2 * W; d0 += MR) {
            KV_VEC_LOCAL VD t[MR][2] = {};
            for (int64_t i = 0; i < m; ++i) {
                const double* x = X + i * D;
                VD b0, b1;
                std::memcpy(&b0, x + c0, sizeof(VD));
                std::memcpy(&b1, x + c0 + W, sizeof(VD));
                for (int64_t r = 0; r < MR; ++r) {
                    const VD a = x[d0 + r] * kOne;
                    t[r][0] += a * b0;
                    t[r][1] += a * b1;
                }
            }
            for (int64_t r = 0; r < MR; ++r)
                for (int64_t h = 0; h < 2; ++h) {
                    double* c = S2 + (d0 + r) * D + c0 + h * W;
                    VD old;
                    std::memcpy(&old, c, sizeof(VD));
                    const VD out = old + t[r][h];
                    std::memcpy(c, &out, sizeof(VD));
                }
        }
}

#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void key_forms_v4(KV_EA_ARGS) { key_forms_body<f32x16, f32x8, f64x8, 4>(KV_EA_PASS); }
__attribute__((target("arch=x86-64-v3"))) void key_forms_v3(KV_EA_ARGS) { key_forms_body<f32x8, f32x4, f64x4, 2>(KV_EA_PASS); }
#endif
void key_forms_v2(KV_EA_ARGS) { key_forms_body<f32x4, f32x2, f64x2, 2>(KV_EA_PASS); }
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void moments_v4(int64_t m, int64_t D, const double* X, double* S2) { moments_body<f64x8>(m, D, X, S2); }
__attribute__((target("arch=x86-64-v3"))) void moments_v3(int64_t m, int64_t D, const double* X, double* S2) { moments_body<f64x4>(m, D, X, S2); }
#endif
void moments_v2(int64_t m, int64_t D, const double* X, double* S2) { moments_body<f64x2>(m, D, X, S2); }

}  // namespace

void ea_key_forms_at(int level, KV_EA_ARGS) {
    if (level <= 0) return key_forms_plain(KV_EA_PASS);
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());  // the CPU's level, capped by KVLAB_CPU_VARIANT
    if (level >= 4) return key_forms_v4(KV_EA_PASS);
    if (level >= 3) return key_forms_v3(KV_EA_PASS);
#endif
    key_forms_v2(KV_EA_PASS);
}

void ea_key_forms(KV_EA_ARGS) { ea_key_forms_at(4, KV_EA_PASS); }

void ea_moments_upper_at(int level, int64_t m, int64_t D, const double* X, double* S2) {
    if (level <= 0) return moments_plain(m, D, X, S2);
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return moments_v4(m, D, X, S2);
    if (level >= 3) return moments_v3(m, D, X, S2);
#endif
    moments_v2(m, D, X, S2);
}

void ea_moments_upper(int64_t m, int64_t D, const double* X, double* S2) { ea_moments_upper_at(4, m, D, X, S2); }

}  // namespace kv
