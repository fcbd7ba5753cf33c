// cap's per-head math (see policy_cap_math.h).
#include "engine/kv/policies/policy_cap_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

constexpr int64_t kBlock = 64;  // values per block of the capacity sums: a block's scaled copy stays in L1

int64_t scratch_size(int64_t D) { return kBlock * D + 3 * D * D + D; }

// In-place Cholesky A = L L^T of the symmetric positive definite A given by its upper triangle U
// (row-major, U[j][i] = A[i][j], i >= j), which becomes L^T (U[k][i] = L[i][k]). Column j of L
// for every i >= j at once, so the inner loop runs along a row (s: scratch of D).
KV_POLICY_VEC_INLINE void cholesky_upper(double* U, int64_t D, double* s) {
    for (int64_t j = 0; j < D; ++j) {
        double* uj = U + j * D;
        std::copy(uj + j, uj + D, s + j);
        for (int64_t k = 0; k < j; ++k) {
            const double* uk = U + k * D;  // L[i][k] for i >= k
            const double t = uk[j];
            for (int64_t i = j; i < D; ++i) s[i] -= uk[i] * t;
        }
        const double piv = std::sqrt(std::max(s[j], 1e-300));
        uj[j] = piv;
        const double inv = 1.0 / piv;
        for (int64_t i = j + 1; i < D; ++i) uj[i] = s[i] * inv;
    }
}

// LiT = (L^-1)^T (row-major, upper triangular, zeros below) from Lt = L^T: forward substitution
// on the unit vectors, row d of L^-1 for every column c <= d at once into Li (scratch), then
// transposed (t: scratch of D).
KV_POLICY_VEC_INLINE void inverse_lower_t(const double* Lt, int64_t D, double* Li, double* LiT, double* t) {
    for (int64_t d = 0; d < D; ++d) {
        std::fill(t, t + d + 1, 0.0);
        t[d] = 1.0;
        for (int64_t e = 0; e < d; ++e) {
            const double coef = Lt[e * D + d];  // L[d][e]
            const double* le = Li + e * D;
            for (int64_t c = 0; c <= e; ++c) t[c] -= coef * le[c];
        }
        const double inv = 1.0 / Lt[d * D + d];
        double* ld = Li + d * D;
        for (int64_t c = 0; c <= d; ++c) ld[c] = t[c] * inv;
        std::fill(ld + d + 1, ld + D, 0.0);
    }
    for (int64_t e = 0; e < D; ++e)
        for (int64_t d = 0; d < D; ++d) LiT[e * D + d] = Li[d * D + e];
}

template <class VD>
KV_POLICY_VEC_INLINE double hsum(const VD& v) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double));
    KV_VEC_LOCAL double lanes[W];
    std::memcpy(lanes, &v, sizeof(VD));
    double s = 0;
    for (int64_t l = 0; l < W; ++l) s += lanes[l];
    return s;
}

// out[r] = the sum of q[r]'s lanes for r < MR: where MR equals the lane count, the MR vectors are
// reduced together (pairwise shuffles and adds, a transpose folded into the sums), else lane by lane.
template <class VD, int64_t MR>
KV_POLICY_VEC_INLINE void store_sums(const VD* q, double* out) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double));
    if constexpr (W == 8 && MR == 8) {
        VD a[4], b[2];
        for (int k = 0; k < 4; ++k)
            a[k] = __builtin_shufflevector(q[2 * k], q[2 * k + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
                   __builtin_shufflevector(q[2 * k], q[2 * k + 1], 1, 9, 3, 11, 5, 13, 7, 15);
        for (int k = 0; k < 2; ++k)
            b[k] = __builtin_shufflevector(a[2 * k], a[2 * k + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
                   __builtin_shufflevector(a[2 * k], a[2 * k + 1], 2, 3, 10, 11, 6, 7, 14, 15);
        const VD c = __builtin_shufflevector(b[0], b[1], 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(b[0], b[1], 4, 5, 6, 7, 12, 13, 14, 15);
        std::memcpy(out, &c, sizeof(VD));
    } else if constexpr (W == 4 && MR == 4) {
        const VD a0 = __builtin_shufflevector(q[0], q[1], 0, 4, 2, 6) + __builtin_shufflevector(q[0], q[1], 1, 5, 3, 7);
        const VD a1 = __builtin_shufflevector(q[2], q[3], 0, 4, 2, 6) + __builtin_shufflevector(q[2], q[3], 1, 5, 3, 7);
        const VD c = __builtin_shufflevector(a0, a1, 0, 1, 4, 5) + __builtin_shufflevector(a0, a1, 2, 3, 6, 7);
        std::memcpy(out, &c, sizeof(VD));
    } else {
        for (int64_t r = 0; r < MR; ++r) out[r] = hsum(q[r]);
    }
}

// Xs (nb x D) = c_i v_i for the nb rows of V (row stride ldv; D % W == 0).
template <class VD>
KV_POLICY_VEC_INLINE void scale_rows(int64_t nb, int64_t D, const double* V, int64_t ldv, const double* c, double* Xs) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double));
    for (int64_t i = 0; i < nb; ++i) {
        const VD ci = c[i] - VD{};
        for (int64_t d = 0; d < D; d += W) {
            VD x;
            std::memcpy(&x, V + i * ldv + d, sizeof(VD));
            x *= ci;
            std::memcpy(Xs + i * D + d, &x, sizeof(VD));
        }
    }
}

// ---- the keys' alignments -------------------------------------------------------------------

void key_dots_plain(int64_t Rp, int64_t m, int64_t D, const float* K, int64_t ldk, const double* MU, double* dots, double* kn) {
    for (int64_t i = 0; i < m; ++i) {
        const float* k = K + i * ldk;
        double q = 0;
        for (int64_t d = 0; d < D; ++d) q += double(k[d]) * double(k[d]);
        kn[i] = q;
        for (int64_t h = 0; h < Rp; ++h) {
            double t = 0;
            for (int64_t d = 0; d < D; ++d) t += MU[h * D + d] * double(k[d]);
            dots[h * m + i] = t;
        }
    }
}

// One key at a time along d (widened to f64 once, kD's doubles), a vector sum per anchor.
constexpr int64_t kMaxKeyD = 512;
template <class VD>
KV_POLICY_VEC_INLINE void key_dots_body(int64_t Rp, int64_t m, int64_t D, const float* K, int64_t ldk, const double* MU, double* dots,
                                        double* kn) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double));
    if (D % W != 0 || D > kMaxKeyD) return key_dots_plain(Rp, m, D, K, ldk, MU, dots, kn);
    KV_VEC_LOCAL double kd[kMaxKeyD];
    for (int64_t i = 0; i < m; ++i) {
        const float* k = K + i * ldk;
        for (int64_t d = 0; d < D; ++d) kd[d] = double(k[d]);
        VD q = VD{};
        for (int64_t d = 0; d < D; d += W) {
            VD a;
            std::memcpy(&a, kd + d, sizeof(VD));
            q += a * a;
        }
        kn[i] = hsum(q);
        for (int64_t h = 0; h < Rp; ++h) {
            VD t = VD{};
            for (int64_t d = 0; d < D; d += W) {
                VD a, u;
                std::memcpy(&a, kd + d, sizeof(VD));
                std::memcpy(&u, MU + h * D + d, sizeof(VD));
                t += a * u;
            }
            dots[h * m + i] = hsum(t);
        }
    }
}

// ---- the leverages --------------------------------------------------------------------------

void leverages_plain(int64_t m, int64_t D, const double* V, int64_t ldv, const double* c, double* l, double* scratch) {
    double *A = scratch + kBlock * D, *Li = A + D * D, *LiT = Li + D * D, *col = LiT + D * D;
    for (int64_t d = 0; d < D; ++d)
        for (int64_t e = 0; e < D; ++e) {
            double sum = 0;
            for (int64_t i = 0; i < m; ++i) sum += c[i] * V[i * ldv + d] * V[i * ldv + e];
            A[d * D + e] = (d == e ? 1.0 : 0.0) + sum;
        }
    cholesky_upper(A, D, col);
    inverse_lower_t(A, D, Li, LiT, col);
    for (int64_t i = 0; i < m; ++i) {
        double q = 0;
        for (int64_t d = 0; d < D; ++d) {
            double y = 0;
            for (int64_t e = 0; e <= d; ++e) y += V[i * ldv + e] * LiT[e * D + d];
            q += y * y;
        }
        l[i] = q;
    }
}

// y_i = L^-1 v_i for MR slots at a time (rows of V), as rows of V (L^-1)^T: register tiles of MR slots x
// 2 vectors of d, the sum over e < d0 + CW only (zeros of the triangle past it); each tile's
// squares go to its slots' sums as it is made, never stored.
template <class VD, int64_t MR>
KV_POLICY_VEC_INLINE void leverage_rows(int64_t i0, int64_t D, const double* V, int64_t ldv, const double* LiT, double* l) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), CW = 2 * W;
    KV_VEC_LOCAL VD q[MR] = {};
    for (int64_t d0 = 0; d0 < D; d0 += CW) {
        KV_VEC_LOCAL VD t[MR][2] = {};
        for (int64_t e = 0; e < d0 + CW; ++e) {
            VD b0, b1;
            std::memcpy(&b0, LiT + e * D + d0, sizeof(VD));
            std::memcpy(&b1, LiT + e * D + d0 + W, sizeof(VD));
            for (int64_t r = 0; r < MR; ++r) {
                const VD a = V[(i0 + r) * ldv + e] - VD{};  // a broadcast (x - 0 is x: folded, read from memory)
                t[r][0] += a * b0;
                t[r][1] += a * b1;
            }
        }
        for (int64_t r = 0; r < MR; ++r) q[r] += t[r][0] * t[r][0] + t[r][1] * t[r][1];
    }
    store_sums<VD, MR>(q, l + i0);
}

// Register tiles of MR rows x 2 vectors of columns (CW = 2 W), 16 accumulators with AVX-512's 32
// registers (MR 8), 8 with 16 (MR 4). Needs D % CW == 0 (CW % MR == 0).
template <class VD, int64_t MR>
KV_POLICY_VEC_INLINE void leverages_body(int64_t m, int64_t D, const double* V, int64_t ldv, const double* c, double* l, double* scratch) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), CW = 2 * W;
    static_assert(CW % MR == 0 && kBlock % MR == 0);
    if (D % CW != 0) return leverages_plain(m, D, V, ldv, c, l, scratch);
    double *Xs = scratch, *A = scratch + kBlock * D, *Li = A + D * D, *LiT = Li + D * D, *col = LiT + D * D;
    std::fill(A, A + D * D, 0.0);
    // A = I + sum_i (c_i v_i) v_i^T on the column blocks [c0, c0 + CW) down to their last row (the
    // upper triangle; entries below it are written too, never read), kBlock values at a time
    for (int64_t i0 = 0; i0 < m; i0 += kBlock) {
        const int64_t nb = std::min(kBlock, m - i0);
        const double* Vb = V + i0 * ldv;
        scale_rows<VD>(nb, D, Vb, ldv, c + i0, Xs);
        for (int64_t c0 = 0; c0 < D; c0 += CW)
            for (int64_t d0 = 0; d0 < c0 + CW; d0 += MR) {
                KV_VEC_LOCAL VD t[MR][2];
                for (int64_t r = 0; r < MR; ++r) {
                    std::memcpy(&t[r][0], A + (d0 + r) * D + c0, sizeof(VD));
                    std::memcpy(&t[r][1], A + (d0 + r) * D + c0 + W, sizeof(VD));
                }
                for (int64_t i = 0; i < nb; ++i) {
                    VD b0, b1;
                    std::memcpy(&b0, Vb + i * ldv + c0, sizeof(VD));
                    std::memcpy(&b1, Vb + i * ldv + c0 + W, sizeof(VD));
                    const double* x = Xs + i * D + d0;
                    for (int64_t r = 0; r < MR; ++r) {
                        const VD a = x[r] - VD{};
                        t[r][0] += a * b0;
                        t[r][1] += a * b1;
                    }
                }
                for (int64_t r = 0; r < MR; ++r) {
                    std::memcpy(A + (d0 + r) * D + c0, &t[r][0], sizeof(VD));
                    std::memcpy(A + (d0 + r) * D + c0 + W, &t[r][1], sizeof(VD));
                }
            }
    }
    for (int64_t d = 0; d < D; ++d) A[d * D + d] += 1.0;
    cholesky_upper(A, D, col);  // A's upper triangle becomes L^T
    inverse_lower_t(A, D, Li, LiT, col);
    const int64_t m4 = m - m % MR;
    for (int64_t i0 = 0; i0 < m4; i0 += MR) leverage_rows<VD, MR>(i0, D, V, ldv, LiT, l);
    for (int64_t i = m4; i < m; ++i) leverage_rows<VD, 1>(i, D, V, ldv, LiT, l);
}

#define KV_DOTS_ARGS int64_t Rp, int64_t m, int64_t D, const float *K, int64_t ldk, const double *MU, double *dots, double *kn
#define KV_DOTS_PASS Rp, m, D, K, ldk, MU, dots, kn
#define KV_LEV_ARGS int64_t m, int64_t D, const double *V, int64_t ldv, const double *c, double *l, double *scratch
#define KV_LEV_PASS m, D, V, ldv, c, l, scratch
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast"))) void key_dots_v4(KV_DOTS_ARGS) { key_dots_body<f64x8>(KV_DOTS_PASS); }
__attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast"))) void key_dots_v3(KV_DOTS_ARGS) { key_dots_body<f64x4>(KV_DOTS_PASS); }
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast"))) void leverages_v4(KV_LEV_ARGS) { leverages_body<f64x8, 8>(KV_LEV_PASS); }
__attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast"))) void leverages_v3(KV_LEV_ARGS) { leverages_body<f64x4, 4>(KV_LEV_PASS); }
#endif

}  // namespace

void cap_key_dots_at(int level, KV_DOTS_ARGS) {
    if (level <= 0) return key_dots_plain(KV_DOTS_PASS);
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());  // the CPU's level, capped by KVLAB_CPU_VARIANT
    if (level >= 4) return key_dots_v4(KV_DOTS_PASS);
    if (level >= 3) return key_dots_v3(KV_DOTS_PASS);
#endif
    key_dots_body<f64x2>(KV_DOTS_PASS);
}

void cap_key_dots(KV_DOTS_ARGS) { cap_key_dots_at(4, KV_DOTS_PASS); }

int64_t cap_leverage_scratch_size(int64_t D) { return scratch_size(D); }

void cap_leverages_at(int level, KV_LEV_ARGS) {
    if (level <= 0) return leverages_plain(KV_LEV_PASS);
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return leverages_v4(KV_LEV_PASS);
    if (level >= 3) return leverages_v3(KV_LEV_PASS);
#endif
    leverages_body<f64x2, 4>(KV_LEV_PASS);
}

void cap_leverages(KV_LEV_ARGS) { cap_leverages_at(4, KV_LEV_PASS); }

}  // namespace kv
