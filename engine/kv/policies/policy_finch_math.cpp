// finch's window softmaxes (see policy_finch_math.h). The body is the plain loops; inlined into a
// function per ISA level, GCC vectorizes the ones across slots (elementwise IEEE operations, no
// contraction: -ffp-contract=off) and leaves every sum in its order.
#include "engine/kv/policies/policy_finch_math.h"

#include <algorithm>
#include <cmath>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

KV_POLICY_VEC_INLINE void window_body(const double* logit, int64_t M, int64_t nq, int64_t T, const int32_t* pos, int64_t first,
                                      const int64_t* late, int64_t n_late, double scale, bool normalize, const double* pre, double* x,
                                      double* e, double* acc) {
    for (int64_t m = 0; m < M; ++m) {
        const int64_t p = first + m % nq;
        const double* row = logit + m * T;
        // branch-free passes: the scaled logits (masked: -inf), their max in four independent
        // chains (a max is exact in any order), the shift
        for (int64_t j = 0; j < T; ++j) x[j] = row[j] * scale;
        for (int64_t k = 0; k < n_late; ++k)
            if (!(pos[late[k]] >= 0 && pos[late[k]] <= p)) x[late[k]] = -INFINITY;
        double mq[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int64_t j4 = 0;
        for (; j4 + 4 <= T; j4 += 4)
            for (int64_t l = 0; l < 4; ++l) mq[l] = std::max(mq[l], x[j4 + l]);
        for (int64_t j = j4; j < T; ++j) mq[0] = std::max(mq[0], x[j]);
        const double mx = std::max(std::max(mq[0], mq[1]), std::max(mq[2], mq[3]));
        for (int64_t j = 0; j < T; ++j) x[j] -= mx;
        for (int64_t k = 0; k < n_late; ++k)
            if (!(pos[late[k]] >= 0 && pos[late[k]] <= p)) x[late[k]] = -1000.0;
        // exponentials in f32, sums in f64 (policy_math.h): within the scores' tolerance
        const double z = policy_exp_sum_f32(x, e, T);
        const double f = (normalize ? double(p) : 1.0) / (z * double(M));
        // (e f) 1 = e f and (e f) 0 = +0: the sums of the masked loop
        for (int64_t j = 0; j < T; ++j) acc[j] += e[j] * f * pre[j];
    }
}

#define KV_FINCH_ARGS                                                                                                                  \
    const double *logit, int64_t M, int64_t nq, int64_t T, const int32_t *pos, int64_t first, const int64_t *late, int64_t n_late, \
        double scale, bool normalize, const double *pre, double *x, double *e, double *acc
#define KV_FINCH_PASS logit, M, nq, T, pos, first, late, n_late, scale, normalize, pre, x, e, acc
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void window_v4(KV_FINCH_ARGS) { window_body(KV_FINCH_PASS); }
__attribute__((target("arch=x86-64-v3"))) void window_v3(KV_FINCH_ARGS) { window_body(KV_FINCH_PASS); }
#endif

}  // namespace

void finch_window_scores(int level, KV_FINCH_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return window_v4(KV_FINCH_PASS);
    if (level >= 3) return window_v3(KV_FINCH_PASS);
#endif
    window_body(KV_FINCH_PASS);
}

}  // namespace kv
