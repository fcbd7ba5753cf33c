// cake's per-row window math (see policy_cake_math.h). The bodies are the plain loops; inlined
// into a function per ISA level, GCC vectorizes the ones across slots (elementwise IEEE
// operations, no contraction: -ffp-contract=off), and leaves every sum in its order.
#include "engine/kv/policies/policy_cake_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

KV_POLICY_VEC_INLINE void softmax_body(const float* logits, int64_t rows, int64_t q, int64_t T, const int32_t* pos, int64_t q0,
                                       float scale, double* xs, double* a) {
    const double sc = double(scale), ninf = -std::numeric_limits<double>::infinity();
    for (int64_t m = 0; m < rows; ++m) {
        const int64_t qp = q0 + m % q;
        const float* z = logits + m * T;
        double* am = a + m * T;
        // the scaled logits; their max over the slots the query sees in four chains (a max is
        // exact in any order); the shift, -inf where it cannot see (exp gives 0)
        for (int64_t j = 0; j < T; ++j) xs[j] = sc * double(z[j]);
        double mq[4] = {ninf, ninf, ninf, ninf};
        int64_t j4 = 0;
        for (; j4 + 4 <= T; j4 += 4)
            for (int64_t l = 0; l < 4; ++l) mq[l] = std::max(mq[l], pos[j4 + l] >= 0 && pos[j4 + l] <= qp ? xs[j4 + l] : ninf);
        for (int64_t j = j4; j < T; ++j) mq[0] = std::max(mq[0], pos[j] >= 0 && pos[j] <= qp ? xs[j] : ninf);
        const double mx = std::max(std::max(mq[0], mq[1]), std::max(mq[2], mq[3]));
        for (int64_t j = 0; j < T; ++j) xs[j] = pos[j] >= 0 && pos[j] <= qp ? xs[j] - mx : ninf;
        // exp at the CPU's vector width (policy_exp_sum: about 1 ulp from std::exp, the same bits
        // on every CPU)
        const double sum = policy_exp_sum(xs, am, T);
        for (int64_t j = 0; j < T; ++j) am[j] /= sum;
    }
}

KV_POLICY_VEC_INLINE void moments_body(const double* a, int64_t R, int64_t q, int64_t T, const int32_t* pos, int64_t q0, double gamma,
                                       bool preference, double* s1, double* s2, double* mean, double* u, double& H, double& V) {
    std::fill(u, u + T, 0.0);
    for (int64_t h = 0; h < R; ++h) {
        std::fill(s1, s1 + T, 0.0), std::fill(s2, s2 + T, 0.0);
        // sums over the queries i run along rows of a (i outer, every j at once): each token's
        // sums still add i = 0, 1, ... in order, as a column walk would
        for (int64_t i = 0; i < q; ++i) {
            const double* ai = a + (h * q + i) * T;
            for (int64_t j = 0; j < T; ++j) s1[j] += ai[j];
        }
        for (int64_t j = 0; j < T; ++j) mean[j] = s1[j] / double(q);
        for (int64_t i = 0; i < q; ++i) {
            const double* ai = a + (h * q + i) * T;
            for (int64_t j = 0; j < T; ++j) {
                const double d = ai[j] - mean[j];
                s2[j] += d * d;
            }
        }
        for (int64_t j = 0; j < T; ++j) {
            const double var = q > 1 ? s2[j] / double(q - 1) : 0.0;
            u[j] += (mean[j] + gamma * var) / double(R);
        }
        if (preference)
            for (int64_t j = 0; j < T; ++j)
                if (pos[j] < q0) {  // tokens before the window
                    V += q > 1 ? s2[j] / double(q - 1) : 0.0;
                    for (int64_t i = 0; i < q; ++i) {
                        const double x = a[(h * q + i) * T + j];
                        H -= x * std::log(x + 1e-10);
                    }
                }
    }
}

#define KV_CAKE_SOFTMAX_ARGS \
    const float *logits, int64_t rows, int64_t q, int64_t T, const int32_t *pos, int64_t q0, float scale, double *xs, double *a
#define KV_CAKE_SOFTMAX_PASS logits, rows, q, T, pos, q0, scale, xs, a
#define KV_CAKE_MOMENTS_ARGS                                                                                                        \
    const double *a, int64_t R, int64_t q, int64_t T, const int32_t *pos, int64_t q0, double gamma, bool preference, double *s1, \
        double *s2, double *mean, double *u, double &H, double &V
#define KV_CAKE_MOMENTS_PASS a, R, q, T, pos, q0, gamma, preference, s1, s2, mean, u, H, V
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void softmax_v4(KV_CAKE_SOFTMAX_ARGS) { softmax_body(KV_CAKE_SOFTMAX_PASS); }
__attribute__((target("arch=x86-64-v3"))) void softmax_v3(KV_CAKE_SOFTMAX_ARGS) { softmax_body(KV_CAKE_SOFTMAX_PASS); }
__attribute__((target("arch=x86-64-v4"))) void moments_v4(KV_CAKE_MOMENTS_ARGS) { moments_body(KV_CAKE_MOMENTS_PASS); }
__attribute__((target("arch=x86-64-v3"))) void moments_v3(KV_CAKE_MOMENTS_ARGS) { moments_body(KV_CAKE_MOMENTS_PASS); }
#endif

}  // namespace

void cake_window_softmax(int level, KV_CAKE_SOFTMAX_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return softmax_v4(KV_CAKE_SOFTMAX_PASS);
    if (level >= 3) return softmax_v3(KV_CAKE_SOFTMAX_PASS);
#endif
    softmax_body(KV_CAKE_SOFTMAX_PASS);
}

void cake_window_moments(int level, KV_CAKE_MOMENTS_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return moments_v4(KV_CAKE_MOMENTS_PASS);
    if (level >= 3) return moments_v3(KV_CAKE_MOMENTS_PASS);
#endif
    moments_body(KV_CAKE_MOMENTS_PASS);
}

}  // namespace kv
