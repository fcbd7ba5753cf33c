// finch's window softmaxes (see policy_finch_math.h). The body is the plain loops; inlined into a
// function per ISA level, GCC vectorizes the ones across slots (elementwise IEEE operations, no
// contraction: -ffp-contract=off) and leaves every sum in its order.
#include "engine/kv/policies/policy_finch_math.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

KV_POLICY_VEC_INLINE void window_body(double* logit, int64_t M, int64_t nq, int64_t T, const int32_t* pos, int64_t first,
                                      const int64_t* late, int64_t n_late, bool normalize, const double* pre, double* x, double* e,
                                      double* acc) {
    for (int64_t m = 0; m < M; ++m) {
        const int64_t p = first + m % nq;
        double* row = logit + m * T;
        // branch-free passes: the scaled logits masked in place (-inf), their max in four
        // independent chains (a max is exact in any order), the shift
        for (int64_t k = 0; k < n_late; ++k)
            if (!(pos[late[k]] >= 0 && pos[late[k]] <= p)) row[late[k]] = -INFINITY;
        double mq[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int64_t j4 = 0;
        for (; j4 + 4 <= T; j4 += 4)
            for (int64_t l = 0; l < 4; ++l) mq[l] = std::max(mq[l], row[j4 + l]);
        for (int64_t j = j4; j < T; ++j) mq[0] = std::max(mq[0], row[j]);
        const double mx = std::max(std::max(mq[0], mq[1]), std::max(mq[2], mq[3]));
        for (int64_t j = 0; j < T; ++j) x[j] = row[j] - mx;
        for (int64_t k = 0; k < n_late; ++k)
            if (!(pos[late[k]] >= 0 && pos[late[k]] <= p)) x[late[k]] = -1000.0;
        // exponentials in f32, sums in f64 (policy_math.h): within the scores' tolerance
        const double z = policy_exp_sum_f32(x, e, T);
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
        bool normalize, const double *pre, double *x, double *e, double *acc
#define KV_FINCH_PASS logit, M, nq, T, pos, first, late, n_late, normalize, pre, x, e, acc
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void window_v4(KV_FINCH_ARGS) { window_body(KV_FINCH_PASS); }
__attribute__((target("arch=x86-64-v3"))) void window_v3(KV_FINCH_ARGS) { window_body(KV_FINCH_PASS); }
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
    window_body(KV_FINCH_PASS);
}

}  // namespace kv
