// L1 norms of projected values (see projected_l1.h).
#include "engine/kv/policies/projected_l1.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

// Tiles of MR rows of W x 2 vectors of columns, accumulated over D in registers; a tile's |.|
// summed over its rows in f32 (MR terms), then added to the columns' double sums. Columns
// outermost, so a column block of Vt (D x 2 vectors) stays in L1 while W streams past it.
template <class V, int64_t MR>
KV_POLICY_VEC_INLINE void rows_tile(int64_t i0, int64_t j0, int64_t D, const float* W, int64_t ldw, const float* Vt, int64_t ldv, V& s0, V& s1) {
    KV_VEC_LOCAL V t[MR][2] = {};
    constexpr int64_t Wd = sizeof(V) / sizeof(float);
    for (int64_t d = 0; d < D; ++d) {
        V b0, b1;
        std::memcpy(&b0, Vt + d * ldv + j0, sizeof(V));
        std::memcpy(&b1, Vt + d * ldv + j0 + Wd, sizeof(V));
        for (int64_t r = 0; r < MR; ++r) {
            const V a = W[(i0 + r) * ldw + d] - V{};  // a broadcast (x - 0 is x: folded, read from memory)
            t[r][0] += a * b0;
            t[r][1] += a * b1;
        }
    }
    for (int64_t r = 0; r < MR; ++r) {
        s0 += t[r][0] < 0 ? -t[r][0] : t[r][0];
        s1 += t[r][1] < 0 ? -t[r][1] : t[r][1];
    }
}

// V's lanes as two halves widened to f64 (VD: half of V's lanes as doubles), in registers.
template <class V, class VD, size_t... I>
KV_POLICY_VEC_INLINE void widen_halves(const V& v, VD& lo, VD& hi, std::index_sequence<I...>) {
    lo = __builtin_convertvector(__builtin_shufflevector(v, v, I...), VD);
    hi = __builtin_convertvector(__builtin_shufflevector(v, v, (I + sizeof...(I))...), VD);
}

template <class V, class VD, int64_t MR>
KV_POLICY_VEC_INLINE void l1_body(int64_t E, int64_t m, int64_t D, const float* W, int64_t ldw, const float* Vt, int64_t ldv, double* acc) {
    constexpr int64_t Wd = sizeof(V) / sizeof(float), H = Wd / 2;
    static_assert(sizeof(VD) / sizeof(double) == size_t(H));
    const int64_t m2 = m - m % (2 * Wd), E4 = E - E % MR;
    for (int64_t j0 = 0; j0 < m2; j0 += 2 * Wd) {
        // the block's 2 Wd column sums stay in registers across W's rows: each tile's f32 sums
        // added to them in row order, as to acc itself
        KV_VEC_LOCAL VD a[4];
        for (int64_t q = 0; q < 4; ++q) std::memcpy(&a[q], acc + j0 + q * H, sizeof(VD));
        for (int64_t i0 = 0; i0 < E; i0 += MR) {
            KV_VEC_LOCAL V s[2] = {};
            if (i0 < E4)
                rows_tile<V, MR>(i0, j0, D, W, ldw, Vt, ldv, s[0], s[1]);
            else
                for (int64_t i = i0; i < E; ++i) rows_tile<V, 1>(i, j0, D, W, ldw, Vt, ldv, s[0], s[1]);
            for (int64_t h = 0; h < 2; ++h) {
                VD lo, hi;
                widen_halves(s[h], lo, hi, std::make_index_sequence<size_t(H)>{});
                a[2 * h] += lo;
                a[2 * h + 1] += hi;
            }
        }
        for (int64_t q = 0; q < 4; ++q) std::memcpy(acc + j0 + q * H, &a[q], sizeof(VD));
    }
    for (int64_t j = m2; j < m; ++j)  // columns past the last pair of vectors
        for (int64_t c = 0; c < E; ++c) {
            float x = 0;
            for (int64_t d = 0; d < D; ++d) x += W[c * ldw + d] * Vt[d * ldv + j];
            acc[j] += std::fabs(double(x));
        }
}

#define KV_L1_ARGS int64_t E, int64_t m, int64_t D, const float *W, int64_t ldw, const float *Vt, int64_t ldv, double *acc
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast"))) void l1_v4(KV_L1_ARGS) {
    l1_body<f32x16, f64x8, 8>(E, m, D, W, ldw, Vt, ldv, acc);
}
__attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast"))) void l1_v3(KV_L1_ARGS) {
    l1_body<f32x8, f64x4, 4>(E, m, D, W, ldw, Vt, ldv, acc);
}
#endif

}  // namespace

void projected_l1_norms(KV_L1_ARGS) {
#if defined(__x86_64__)
    const int level = policy_matmul_level();
    if (level >= 4) return l1_v4(E, m, D, W, ldw, Vt, ldv, acc);
    if (level >= 3) return l1_v3(E, m, D, W, ldw, Vt, ldv, acc);
#endif
    l1_body<f32x4, f64x2, 4>(E, m, D, W, ldw, Vt, ldv, acc);
}

}  // namespace kv
