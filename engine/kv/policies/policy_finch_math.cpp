// finch's logits and window softmaxes (see policy_finch_math.h). The softmax body is elementwise
// IEEE operations (no contraction: -ffp-contract=off) at each level's width, with every sum in
// one fixed order, so every level gives the same bits.
#include "engine/kv/policies/policy_finch_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_expf.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

// Two vectors of W floats as one of 2 W and back, in registers (a round trip through memory
// would stall on store forwarding).
template <class VE, class VH, size_t... I>
KV_POLICY_VEC_INLINE void concat(const VH& a, const VH& b, VE& out, std::index_sequence<I...>) {
    out = __builtin_shufflevector(a, b, I...);
}
template <class VE, class VH, size_t... I>
KV_POLICY_VEC_INLINE void halves(const VE& v, VH& lo, VH& hi, std::index_sequence<I...>) {
    lo = __builtin_shufflevector(v, v, I...);
    hi = __builtin_shufflevector(v, v, (I + sizeof...(I))...);
}

// One pass per window query after its max: the shift in f64, the exponential of 2 W lanes at a
// time in f32 (VE: 2 W floats, VH: W floats, VD: W doubles), the weights stored in f64 and summed
// into 8 interleaved partial sums (element j to sum j % 8, each in order; reduced as
// ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))): the sums of policy_exp_sum_f32 on the
// shifted row, whatever the width.
template <class VE, class VH, class VD>
KV_POLICY_VEC_INLINE void window_body(double* logit, int64_t M, int64_t nq, int64_t T, const int32_t* pos, int64_t first,
                                      const int64_t* late, int64_t n_late, bool normalize, const double* pre, double* e, double* acc) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), NV = 8 / W;
    static_assert(sizeof(VE) == 2 * sizeof(VH) && sizeof(VH) / sizeof(float) == size_t(W));
    const int64_t T2 = T - T % (2 * W);
    for (int64_t m = 0; m < M; ++m) {
        const int64_t p = first + m % nq;
        double* row = logit + m * T;
        // the slots this query may not see masked in place (-inf: weight 0), then the max (exact
        // in any order)
        for (int64_t k = 0; k < n_late; ++k)
            if (!(pos[late[k]] >= 0 && pos[late[k]] <= p)) row[late[k]] = -INFINITY;
        double mx = -INFINITY;
        {
            VD top = VD{} - INFINITY;
            for (int64_t j = 0; j < T2; j += W) {
                VD a;
                std::memcpy(&a, row + j, sizeof(VD));
                top = top < a ? a : top;
            }
            KV_VEC_LOCAL double lanes[W];
            std::memcpy(lanes, &top, sizeof(VD));
            for (int64_t l = 0; l < W; ++l) mx = std::max(mx, lanes[l]);
            for (int64_t j = T2; j < T; ++j) mx = std::max(mx, row[j]);
        }
        KV_VEC_LOCAL VD zs[NV] = {};
        for (int64_t j = 0; j < T2; j += 2 * W) {
            VD a0, a1;
            std::memcpy(&a0, row + j, sizeof(VD));
            std::memcpy(&a1, row + j + W, sizeof(VD));
            const VH f0 = __builtin_convertvector(a0 - mx, VH), f1 = __builtin_convertvector(a1 - mx, VH);
            VE f, y;
            concat(f0, f1, f, std::make_index_sequence<2 * W>{});
            expf_core(f, y);
            VH y0, y1;
            halves(y, y0, y1, std::make_index_sequence<W>{});
            const VD d0 = __builtin_convertvector(y0, VD), d1 = __builtin_convertvector(y1, VD);
            std::memcpy(e + j, &d0, sizeof(VD));
            std::memcpy(e + j + W, &d1, sizeof(VD));
            zs[(j % 8) / W] += d0;
            zs[((j + W) % 8) / W] += d1;
        }
        KV_VEC_LOCAL double s[8];
        std::memcpy(s, zs, sizeof(s));
        for (int64_t j = T2; j < T; ++j) {
            float y;
            expf_core(float(row[j] - mx), y);
            e[j] = double(y);
            s[j % 8] += e[j];
        }
        const double z = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        const double f = (normalize ? double(p) : 1.0) / (z * double(M));
        // (e f) 1 = e f and (e f) 0 = +0: the sums of the masked loop
        for (int64_t j = 0; j < T; ++j) acc[j] += e[j] * f * pre[j];
    }
}

// The logits: register tiles of MR rows x 2 vectors of columns, summed over all of D before they
// are stored (16 accumulators with AVX-512's 32 registers, 8 with 16); rows past the last tile
// of MR and columns past the last pair of vectors take a plain loop. Each block of 2 W columns of
// Kt is first copied to a contiguous panel in f64 (exact): Kt's rows are a cache length apart (a multiple of
// 4 KiB for the usual lengths), so the block's D rows would share a few L1 sets and evict each
// other on every row tile.
constexpr int64_t kPanelMaxD = 256;
template <class V, int64_t MR>
KV_POLICY_VEC_INLINE void logits_body(int64_t M, int64_t T, int64_t D, const double* Q, const float* Kt, int64_t ldk, double scale, double* C) {
    constexpr int64_t W = int64_t(sizeof(V) / sizeof(double));
    const int64_t M4 = M - M % MR, T2 = D <= kPanelMaxD ? T - T % (2 * W) : 0;
    KV_VEC_LOCAL double panel[kPanelMaxD * 2 * W];
    for (int64_t j0 = 0; j0 < T2; j0 += 2 * W) {
        for (int64_t d = 0; d < D; ++d)
            for (int64_t l = 0; l < 2 * W; ++l) panel[d * 2 * W + l] = double(Kt[d * ldk + j0 + l]);
        for (int64_t i0 = 0; i0 < M4; i0 += MR) {
            KV_VEC_LOCAL V t[MR][2] = {};
            for (int64_t d = 0; d < D; ++d) {
                V b0, b1;
                std::memcpy(&b0, panel + d * 2 * W, sizeof(V));
                std::memcpy(&b1, panel + d * 2 * W + W, sizeof(V));
                for (int64_t r = 0; r < MR; ++r) {
                    const V a = Q[(i0 + r) * D + d] - V{};  // a broadcast (x - 0 is x: folded, read from memory)
                    t[r][0] += a * b0;
                    t[r][1] += a * b1;
                }
            }
            for (int64_t r = 0; r < MR; ++r) {
                const V o0 = t[r][0] * scale, o1 = t[r][1] * scale;
                std::memcpy(C + (i0 + r) * T + j0, &o0, sizeof(V));
                std::memcpy(C + (i0 + r) * T + j0 + W, &o1, sizeof(V));
            }
        }
    }
    auto plain = [&](int64_t i, int64_t j) {
        double sum = 0;
        for (int64_t d = 0; d < D; ++d) sum += Q[i * D + d] * double(Kt[d * ldk + j]);
        C[i * T + j] = sum * scale;
    };
    for (int64_t i = 0; i < M4; ++i)
        for (int64_t j = T2; j < T; ++j) plain(i, j);
    for (int64_t i = M4; i < M; ++i)
        for (int64_t j = 0; j < T; ++j) plain(i, j);
}

#define KV_FINCH_LOGIT_ARGS int64_t M, int64_t T, int64_t D, const double *Q, const float *Kt, int64_t ldk, double scale, double *C
#define KV_FINCH_LOGIT_PASS M, T, D, Q, Kt, ldk, scale, C
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast"))) void logits_v4(KV_FINCH_LOGIT_ARGS) {
    logits_body<f64x8, 8>(KV_FINCH_LOGIT_PASS);
}
__attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast"))) void logits_v3(KV_FINCH_LOGIT_ARGS) {
    logits_body<f64x4, 4>(KV_FINCH_LOGIT_PASS);
}
#endif

#define KV_FINCH_ARGS                                                                                                       \
    double *logit, int64_t M, int64_t nq, int64_t T, const int32_t *pos, int64_t first, const int64_t *late, int64_t n_late, \
        bool normalize, const double *pre, double *e, double *acc
#define KV_FINCH_PASS logit, M, nq, T, pos, first, late, n_late, normalize, pre, e, acc
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void window_v4(KV_FINCH_ARGS) { window_body<f32x16, f32x8, f64x8>(KV_FINCH_PASS); }
__attribute__((target("arch=x86-64-v3"))) void window_v3(KV_FINCH_ARGS) { window_body<f32x8, f32x4, f64x4>(KV_FINCH_PASS); }
#endif

}  // namespace

void finch_logits_at(int level, KV_FINCH_LOGIT_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return logits_v4(KV_FINCH_LOGIT_PASS);
    if (level >= 3) return logits_v3(KV_FINCH_LOGIT_PASS);
#endif
    logits_body<f64x2, 4>(KV_FINCH_LOGIT_PASS);
}

void finch_logits(KV_FINCH_LOGIT_ARGS) { finch_logits_at(4, KV_FINCH_LOGIT_PASS); }

void finch_window_scores(int level, KV_FINCH_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return window_v4(KV_FINCH_PASS);
    if (level >= 3) return window_v3(KV_FINCH_PASS);
#endif
    window_body<f32x4, f32x2, f64x2>(KV_FINCH_PASS);
}

}  // namespace kv
