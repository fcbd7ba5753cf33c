// The redundancy pass of rkv (see policy_similarity_scan.h), one body for every vector width.
#include "engine/kv/policies/policy_similarity_scan.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

typedef long long i64x2 __attribute__((vector_size(16)));
typedef long long i64x4 __attribute__((vector_size(32)));
typedef long long i64x8 __attribute__((vector_size(64)));
template <class V>
struct MaskOf;
template <>
struct MaskOf<f64x2> {
    using type = i64x2;
};
template <>
struct MaskOf<f64x4> {
    using type = i64x4;
};
template <>
struct MaskOf<f64x8> {
    using type = i64x8;
};

// m ? a : b lane by lane (m: all ones or zeros) in bit operations: GCC expands a vector ?: on
// doubles one lane at a time.
// (out by reference: a vector return's ABI depends on the ISA flags, policy_vec.h)
template <class VD, class I>
KV_POLICY_VEC_INLINE void select(VD& out, const I& m, const VD& a, const VD& b) {
    I ia, ib;
    std::memcpy(&ia, &a, sizeof(VD));
    std::memcpy(&ib, &b, sizeof(VD));
    const I r = (ia & m) | (ib & ~m);
    std::memcpy(&out, &r, sizeof(VD));
}

// NB vectors of columns at a time, their state in registers across all rows (one chain per
// column); the columns left over take the plain loop.
template <class VF, class VD>
KV_POLICY_VEC_INLINE void similarity_columns_body(const float* S, int64_t ld, int64_t rows, int64_t n, int64_t c0, const int32_t* pos,
                                                  double threshold, double* sum, double* newest, double* exempt) {
    constexpr int64_t W = int64_t(sizeof(VD) / sizeof(double)), NB = 4;
    static_assert(sizeof(VF) / sizeof(float) == size_t(W));
    using I = typename MaskOf<VD>::type;
    const VD th = VD{} + threshold;
    int64_t c = 0;
    for (; c + NB * W <= n; c += NB * W) {
        KV_VEC_LOCAL VD su[NB], nw[NB], ex[NB], self[NB];
        std::memcpy(su, sum + c, sizeof(su));
        std::memcpy(nw, newest + c, sizeof(nw));
        std::memcpy(ex, exempt + c, sizeof(ex));
        {
            KV_VEC_LOCAL double lanes[NB * W];
            for (int64_t l = 0; l < NB * W; ++l) lanes[l] = double(c0 + c + l);
            std::memcpy(self, lanes, sizeof(self));
        }
        // only rows [c0 + c, c0 + c + NB W) meet a column's own slot: the rest skip the test
        auto pass = [&](int64_t j_begin, int64_t j_end, auto check) {
            for (int64_t j = j_begin; j < j_end; ++j) {
                const VD p = VD{} + double(pos[j]), jd = VD{} + double(j);
                for (int64_t b = 0; b < NB; ++b) {
                    VF a;
                    std::memcpy(&a, S + j * ld + c + b * W, sizeof(VF));
                    VD v = __builtin_convertvector(a, VD);
                    I take = (v > th) & (p > nw[b]);
                    if constexpr (decltype(check)::value) {
                        const I other = self[b] != jd;
                        select(v, other, v, VD{});
                        take &= other;
                    }
                    su[b] += v;
                    select(nw[b], take, p, nw[b]);
                    select(ex[b], take, v, ex[b]);
                }
            }
        };
        const int64_t s0 = std::clamp<int64_t>(c0 + c, 0, rows), s1 = std::clamp<int64_t>(c0 + c + NB * W, 0, rows);
        pass(0, s0, std::false_type{});
        pass(s0, s1, std::true_type{});
        pass(s1, rows, std::false_type{});
        std::memcpy(sum + c, su, sizeof(su));
        std::memcpy(newest + c, nw, sizeof(nw));
        std::memcpy(exempt + c, ex, sizeof(ex));
    }
    for (; c < n; ++c) {
        double s = sum[c], nc = newest[c], e = exempt[c];
        for (int64_t j = 0; j < rows; ++j) {
            const bool other = j != c0 + c;
            const double v = other ? double(S[j * ld + c]) : 0.0;
            s += v;
            if (other && v > threshold && double(pos[j]) > nc) nc = double(pos[j]), e = v;
        }
        sum[c] = s, newest[c] = nc, exempt[c] = e;
    }
}

#define KV_SIMCOL_ARGS                                                                                                              \
    const float *S, int64_t ld, int64_t rows, int64_t n, int64_t c0, const int32_t *pos, double threshold, double *sum, double *newest, \
        double *exempt
#define KV_SIMCOL_PASS S, ld, rows, n, c0, pos, threshold, sum, newest, exempt
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"))) void similarity_columns_v4(KV_SIMCOL_ARGS) {
    similarity_columns_body<f32x4, f64x4>(KV_SIMCOL_PASS);  // ymm: GCC 12 fails (ICE) on zmm compares as masks
}
__attribute__((target("arch=x86-64-v3"))) void similarity_columns_v3(KV_SIMCOL_ARGS) {
    similarity_columns_body<f32x4, f64x4>(KV_SIMCOL_PASS);
}
#endif

}  // namespace

void policy_similarity_columns_at(int level, KV_SIMCOL_ARGS) {
#if defined(__x86_64__)
    level = std::min(level, policy_matmul_level());
    if (level >= 4) return similarity_columns_v4(KV_SIMCOL_PASS);
    if (level >= 3) return similarity_columns_v3(KV_SIMCOL_PASS);
#endif
    similarity_columns_body<f32x2, f64x2>(KV_SIMCOL_PASS);
}

void policy_similarity_columns(KV_SIMCOL_ARGS) { policy_similarity_columns_at(4, KV_SIMCOL_PASS); }

}  // namespace kv
