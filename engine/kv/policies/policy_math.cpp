// Dense products for matrix-scoring policies (see policy_math.h).
#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_expf.h"
#include "engine/kv/policies/policy_vec.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace kv {

namespace {

// GCC vector types of each level's register width (policy_vec.h: xmm for the default x86-64-v2
// build, ymm for v3, zmm for v4).

// A register tile of MR rows x 2 vectors of C accumulates over all of k before it is stored:
// MR = 4 where the ISA has 16 vector registers (8 accumulators, 2 B vectors and a broadcast),
// 8 with AVX-512's 32 (each B load then feeds 16 products, not 8). Rows past the last group
// of MR and columns past the last pair of vectors take a plain loop. Every output is one sum
// over k in order whatever the tile (no FMA contraction: -ffp-contract=off), so the bits do
// not depend on MR.
// Bodies are KV_POLICY_VEC_INLINE (policy_vec.h): inlined into each target-specific caller.
template <class V, class F, int64_t MR = 4>
KV_POLICY_VEC_INLINE void matmul_body(int64_t m, int64_t n, int64_t k, const F* A, int64_t lda, const F* B, int64_t ldb,
                                                       F* C, int64_t ldc, bool acc) {
    constexpr int64_t W = int64_t(sizeof(V) / sizeof(F));
    const int64_t m4 = m - m % MR, n2 = n - n % (2 * W);
    for (int64_t i0 = 0; i0 < m4; i0 += MR)
        for (int64_t j0 = 0; j0 < n2; j0 += 2 * W) {
            KV_VEC_LOCAL V t[MR][2] = {};
            for (int64_t d = 0; d < k; ++d) {
                V b0, b1;
                std::memcpy(&b0, B + d * ldb + j0, sizeof(V));
                std::memcpy(&b1, B + d * ldb + j0 + W, sizeof(V));
                for (int64_t r = 0; r < MR; ++r) {
                    const V a = V{} + A[(i0 + r) * lda + d];
                    t[r][0] += a * b0;
                    t[r][1] += a * b1;
                }
            }
            for (int64_t r = 0; r < MR; ++r)
                for (int64_t h = 0; h < 2; ++h) {
                    F* c = C + (i0 + r) * ldc + j0 + h * W;
                    V old = V{};
                    if (acc) std::memcpy(&old, c, sizeof(V));
                    const V out = old + t[r][h];
                    std::memcpy(c, &out, sizeof(V));
                }
        }
    auto plain = [&](int64_t i, int64_t j) {
        F sum = 0;
        for (int64_t d = 0; d < k; ++d) sum += A[i * lda + d] * B[d * ldb + j];
        C[i * ldc + j] = (acc ? C[i * ldc + j] : F(0)) + sum;
    };
    for (int64_t i = 0; i < m4; ++i)
        for (int64_t j = n2; j < n; ++j) plain(i, j);
    for (int64_t i = m4; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) plain(i, j);
}

#define KV_MATMUL_ARGS(F) int64_t m, int64_t n, int64_t k, const F *A, int64_t lda, const F *B, int64_t ldb, F *C, int64_t ldc, bool acc
#define KV_MATMUL_PASS m, n, k, A, lda, B, ldb, C, ldc, acc
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void matmul_v4(KV_MATMUL_ARGS(float)) { matmul_body<f32x16, float, 8>(KV_MATMUL_PASS); }
__attribute__((target("arch=x86-64-v4"))) void matmul_v4(KV_MATMUL_ARGS(double)) { matmul_body<f64x8, double, 8>(KV_MATMUL_PASS); }
__attribute__((target("arch=x86-64-v3"))) void matmul_v3(KV_MATMUL_ARGS(float)) { matmul_body<f32x8>(KV_MATMUL_PASS); }
__attribute__((target("arch=x86-64-v3"))) void matmul_v3(KV_MATMUL_ARGS(double)) { matmul_body<f64x4>(KV_MATMUL_PASS); }

// 4 = AVX-512 (F, BW, DQ, VL), 3 = AVX2 + FMA, 2 = the build's baseline; asked of the CPU once.
// KVLAB_CPU_VARIANT=avx2 / base caps it as it does the kernels, so an AVX-512 machine can run
// (and test) the narrower paths.
int cpu_level() {
    static const int level = [] {
        const char* forced = std::getenv("KVLAB_CPU_VARIANT");
        const int cap = forced && std::strcmp(forced, "base") == 0 ? 2 : forced && std::strcmp(forced, "avx2") == 0 ? 3 : 4;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
            __builtin_cpu_supports("avx512vl"))
            return std::min(cap, 4);
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2")) return std::min(cap, 3);
        return 2;
    }();
    return level;
}
#endif

// exp by Cody-Waite reduction x = k ln2 + r (|r| <= ln2 / 2) and the Taylor series of e^r to
// r^13 (truncation < 2e-17 relative), scaled by 2^k built in the exponent bits. Written once for
// a scalar and for GCC vectors: the same operations lane by lane (no contraction: the build uses
// -ffp-contract=off), so every width computes the same bits.
typedef long long i64x2 __attribute__((vector_size(16)));
typedef long long i64x4 __attribute__((vector_size(32)));
typedef long long i64x8 __attribute__((vector_size(64)));
template <class T>
struct IntOf;
template <>
struct IntOf<double> {
    using type = long long;
};
template <>
struct IntOf<f64x2> {
    using type = i64x2;
};
template <>
struct IntOf<f64x4> {
    using type = i64x4;
};
template <>
struct IntOf<f64x8> {
    using type = i64x8;
};
// Vectors go by reference: a vector returned by value would change the ABI with the ISA flags.
template <class To, class From>
KV_POLICY_VEC_INLINE void bits_as(To& t, const From& f) {
    static_assert(sizeof(To) == sizeof(From));
    std::memcpy(&t, &f, sizeof(To));
}
template <class T>
KV_POLICY_VEC_INLINE void exp_core(const T& in, T& y) {
    using I = typename IntOf<T>::type;
    const T lo = T{} - 745.0, hi = T{} + 709.0;
    T x = in < lo ? lo : in;
    x = x > hi ? hi : x;
    const double shifter = 0x1.8p52;  // adding it rounds to an integer held in the low mantissa bits
    const T t = x * 1.4426950408889634 + shifter;
    const T kd = t - shifter;
    const T r = (x - kd * 0x1.62e42fee00000p-1) - kd * 0x1.a39ef35793c76p-33;
    T p = T{} + 1.0 / 6227020800.0;  // 1/13!
    const double c[13] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0,
                          1.0 / 120.0,       1.0 / 24.0,       1.0 / 6.0,        0.5,              1.0,           1.0};
    for (double ci : c) p = p * r + ci;
    I k;
    long long sh;
    bits_as(k, t);
    bits_as(sh, shifter);
    k = (k - sh + 1023) << 52;
    T scale;
    bits_as(scale, k);
    y = p * scale;
    y = x < -708.0 ? T{} : y;  // 2^k below the normal range: 0 (std::exp: a subnormal)
}
template <class V>
KV_POLICY_VEC_INLINE double exp_sum_body(const double* x, double* y, int64_t n) {
    constexpr int64_t W = int64_t(sizeof(V) / sizeof(double)), NV = 8 / W;
    KV_VEC_LOCAL V acc[NV] = {};
    const int64_t n8 = n - n % 8;
    for (int64_t i = 0; i < n8; i += 8)
        for (int64_t v = 0; v < NV; ++v) {
            V a, e;
            std::memcpy(&a, x + i + v * W, sizeof(V));
            exp_core(a, e);
            std::memcpy(y + i + v * W, &e, sizeof(V));
            acc[v] += e;
        }
    KV_VEC_LOCAL double s[8];
    std::memcpy(s, acc, sizeof(s));
    for (int64_t i = n8; i < n; ++i) {
        exp_core(x[i], y[i]);
        s[i % 8] += y[i];
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) double exp_sum_v4(const double* x, double* y, int64_t n) { return exp_sum_body<f64x8>(x, y, n); }
__attribute__((target("arch=x86-64-v3"))) double exp_sum_v3(const double* x, double* y, int64_t n) { return exp_sum_body<f64x4>(x, y, n); }
#endif


// VF: f32 lanes as many as VD's f64 lanes (the conversions between them).
template <class VF, class VD>
KV_POLICY_VEC_INLINE double exp_sum_f32_body(const double* x, double* y, int64_t n) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), NV = 8 / W;
    static_assert(sizeof(VF) / sizeof(float) == size_t(W));
    KV_VEC_LOCAL VD acc[NV] = {};
    const int64_t n8 = n - n % 8;
    for (int64_t i = 0; i < n8; i += 8)
        for (int64_t v = 0; v < NV; ++v) {
            VD a;
            std::memcpy(&a, x + i + v * W, sizeof(VD));
            VF f = __builtin_convertvector(a, VF), e;
            expf_core(f, e);
            const VD ed = __builtin_convertvector(e, VD);
            std::memcpy(y + i + v * W, &ed, sizeof(VD));
            acc[v] += ed;
        }
    KV_VEC_LOCAL double s[8];
    std::memcpy(s, acc, sizeof(s));
    for (int64_t i = n8; i < n; ++i) {
        float e;
        expf_core(float(x[i]), e);
        y[i] = double(e);
        s[i % 8] += y[i];
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) double exp_sum_f32_v4(const double* x, double* y, int64_t n) {
    return exp_sum_f32_body<f32x8, f64x8>(x, y, n);
}
__attribute__((target("arch=x86-64-v3"))) double exp_sum_f32_v3(const double* x, double* y, int64_t n) {
    return exp_sum_f32_body<f32x4, f64x4>(x, y, n);
}
#endif

template <class F, class V>
void matmul_dispatch(int level, KV_MATMUL_ARGS(F)) {
#if defined(__x86_64__)
    level = std::min(level, cpu_level());
    if (level >= 4) return matmul_v4(KV_MATMUL_PASS);
    if (level >= 3) return matmul_v3(KV_MATMUL_PASS);
#endif
    matmul_body<V>(KV_MATMUL_PASS);
}

}  // namespace

void policy_matmul(KV_MATMUL_ARGS(float)) { matmul_dispatch<float, f32x4>(4, KV_MATMUL_PASS); }
void policy_matmul(KV_MATMUL_ARGS(double)) { matmul_dispatch<double, f64x2>(4, KV_MATMUL_PASS); }
void policy_matmul_at(int level, KV_MATMUL_ARGS(float)) { matmul_dispatch<float, f32x4>(level, KV_MATMUL_PASS); }
void policy_matmul_at(int level, KV_MATMUL_ARGS(double)) { matmul_dispatch<double, f64x2>(level, KV_MATMUL_PASS); }
double policy_exp_sum_at(int level, const double* x, double* y, int64_t n) {
#if defined(__x86_64__)
    level = std::min(level, cpu_level());
    if (level >= 4) return exp_sum_v4(x, y, n);
    if (level >= 3) return exp_sum_v3(x, y, n);
#endif
    return exp_sum_body<f64x2>(x, y, n);
}
double policy_exp_sum(const double* x, double* y, int64_t n) { return policy_exp_sum_at(4, x, y, n); }

double policy_exp_sum_f32_at(int level, const double* x, double* y, int64_t n) {
#if defined(__x86_64__)
    level = std::min(level, cpu_level());
    if (level >= 4) return exp_sum_f32_v4(x, y, n);
    if (level >= 3) return exp_sum_f32_v3(x, y, n);
#endif
    return exp_sum_f32_body<f32x2, f64x2>(x, y, n);
}
double policy_exp_sum_f32(const double* x, double* y, int64_t n) { return policy_exp_sum_f32_at(4, x, y, n); }

int policy_matmul_level() {
#if defined(__x86_64__)
    return cpu_level();
#else
    return 2;
#endif
}

}  // namespace kv
