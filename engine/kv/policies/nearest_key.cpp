// The kept key most cosine-similar to each evicted key (see nearest_key.h).
#include "engine/kv/policies/nearest_key.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_vec.h"

namespace kv {

namespace {

double exact_dot(const float* a, const float* b, int64_t D) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(a[d]) * double(b[d]);
    return s;
}

// The definition's cosine given the exact norms.
double exact_cos(const float* e, double ne, const float* k, double nk, int64_t D) {
    return ne > 0 && nk > 0 ? exact_dot(e, k, D) / (ne * nk) : 0.0;
}

// Norms in this range keep the f32 product's rounding bound (below) valid: no overflow, and
// underflowed products far below the bound.
bool screenable(double n) { return n >= 1e-10 && n <= 1e10; }

// C (ne x nk) = E (ne x D) . Kt (D x nk) in f32, and bmax[j * nb + b] = max of row j over
// block b of kBlock columns. Register tiles of MR rows x 2 vectors as policy_matmul's, each
// folding into its rows' running block maxima, so the screen reads nb values per row instead
// of nk. FMA contraction is allowed here: the screen's bound holds for any rounding order.
constexpr int64_t kBlock = 128;

template <class V, int64_t MR>
KV_POLICY_VEC_INLINE void dots_rows(int64_t i0, int64_t nk, int64_t D, const float* E, const float* Kt, float* C, float* bmax, int64_t nb) {
    constexpr int64_t W = sizeof(V) / sizeof(float);
    static_assert(kBlock % (2 * W) == 0, "a block holds whole tiles");
    const float inf = std::numeric_limits<float>::infinity();
    const int64_t n2 = nk - nk % (2 * W);
    for (int64_t b = 0; b < nb; ++b) {
        KV_VEC_LOCAL V m[MR];
        for (V& v : m) v = V{} - inf;
        const int64_t jend = std::min(n2, (b + 1) * kBlock);
        for (int64_t j0 = b * kBlock; j0 < jend; j0 += 2 * W) {
            KV_VEC_LOCAL V t[MR][2] = {};
            for (int64_t d = 0; d < D; ++d) {
                V b0, b1;
                std::memcpy(&b0, Kt + d * nk + j0, sizeof(V));
                std::memcpy(&b1, Kt + d * nk + j0 + W, sizeof(V));
                for (int64_t r = 0; r < MR; ++r) {
                    const V a = V{} + E[(i0 + r) * D + d];
                    t[r][0] += a * b0;
                    t[r][1] += a * b1;
                }
            }
            for (int64_t r = 0; r < MR; ++r) {
                std::memcpy(C + (i0 + r) * nk + j0, &t[r][0], sizeof(V));
                std::memcpy(C + (i0 + r) * nk + j0 + W, &t[r][1], sizeof(V));
                const V hi = t[r][0] > t[r][1] ? t[r][0] : t[r][1];
                m[r] = hi > m[r] ? hi : m[r];
            }
        }
        for (int64_t r = 0; r < MR; ++r) {
            float x = -inf;
            for (int64_t l = 0; l < W; ++l) x = std::max(x, m[r][l]);
            for (int64_t j = std::max(n2, b * kBlock); j < std::min(nk, (b + 1) * kBlock); ++j) {  // the columns past the tiles
                float sum = 0;
                for (int64_t d = 0; d < D; ++d) sum += E[(i0 + r) * D + d] * Kt[d * nk + j];
                C[(i0 + r) * nk + j] = sum;
                x = std::max(x, sum);
            }
            bmax[(i0 + r) * nb + b] = x;
        }
    }
}

template <class V, int64_t MR>
KV_POLICY_VEC_INLINE void dots_body(int64_t ne, int64_t nk, int64_t D, const float* E, const float* Kt, float* C, float* bmax, int64_t nb) {
    int64_t i0 = 0;
    for (; i0 + MR <= ne; i0 += MR) dots_rows<V, MR>(i0, nk, D, E, Kt, C, bmax, nb);
    for (; i0 < ne; ++i0) dots_rows<V, 1>(i0, nk, D, E, Kt, C, bmax, nb);
}

#define KV_DOTS_ARGS int64_t ne, int64_t nk, int64_t D, const float *E, const float *Kt, float *C, float *bmax, int64_t nb
#if defined(__x86_64__)
__attribute__((target("arch=x86-64-v4"), optimize("fp-contract=fast"))) void dots_v4(KV_DOTS_ARGS) {
    dots_body<f32x16, 8>(ne, nk, D, E, Kt, C, bmax, nb);
}
__attribute__((target("arch=x86-64-v3"), optimize("fp-contract=fast"))) void dots_v3(KV_DOTS_ARGS) {
    dots_body<f32x8, 4>(ne, nk, D, E, Kt, C, bmax, nb);
}
#endif

void dots(KV_DOTS_ARGS) {
#if defined(__x86_64__)
    const int level = policy_matmul_level();
    if (level >= 4) return dots_v4(ne, nk, D, E, Kt, C, bmax, nb);
    if (level >= 3) return dots_v3(ne, nk, D, E, Kt, C, bmax, nb);
#endif
    dots_body<f32x4, 4>(ne, nk, D, E, Kt, C, bmax, nb);
}

}  // namespace

void nearest_by_cosine(const float* keys, int64_t D, const int32_t* evicted, int64_t ne, const int32_t* kept, int64_t nk, int32_t* best,
                       double* cos, NearestKeyScratch& s) {
    auto kept_key = [&](int64_t i) { return keys + int64_t(kept[i]) * D; };
    // Norms in f32 for the screen (eight partial sums, so they vectorise); the exact ones only
    // for the keys the screen lets through, once each.
    s.kn.assign(size_t(nk), -1.0);
    s.rk.resize(size_t(nk));
    s.cols.clear();
    std::vector<int32_t> special;  // kept keys the screen cannot bound: always recomputed
    for (int64_t i = 0; i < nk; ++i) {
        const float* k = kept_key(i);
        float p[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t d = 0;
        for (; d + 8 <= D; d += 8)
            for (int l = 0; l < 8; ++l) p[l] += k[d + l] * k[d + l];
        for (; d < D; ++d) p[0] += k[d] * k[d];
        const float nf = std::sqrt(((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7])));
        if (screenable(nf)) {
            s.rk[size_t(i)] = 1.0f / nf;
            s.cols.push_back(int32_t(i));
        } else {
            special.push_back(int32_t(i));
        }
    }
    auto exact_norm = [&](int64_t i) {
        double& n = s.kn[size_t(i)];
        if (n < 0) n = std::sqrt(exact_dot(kept_key(i), kept_key(i), D));
        return n;
    };
    // Kt = the screenable unit keys transposed (the product is then |e| cos), 16 keys at a time
    // so the writes run along rows; E = the evicted keys gathered.
    const int64_t nc = int64_t(s.cols.size()), nb = (nc + kBlock - 1) / kBlock;
    s.kt.resize(size_t(D * nc));
    s.e.resize(size_t(ne * D));
    s.dots.resize(size_t(ne * nc));
    s.bmax.resize(size_t(ne * nb));
    for (int64_t c0 = 0; c0 < nc; c0 += 16)
        for (int64_t d = 0; d < D; ++d)
            for (int64_t c = c0; c < std::min(nc, c0 + 16); ++c) {
                const int32_t i = s.cols[size_t(c)];
                s.kt[size_t(d * nc + c)] = kept_key(i)[d] * s.rk[size_t(i)];
            }
    for (int64_t j = 0; j < ne; ++j) std::copy_n(keys + int64_t(evicted[j]) * D, D, s.e.data() + j * D);
    if (nc > 0) dots(ne, nc, D, s.e.data(), s.kt.data(), s.dots.data(), s.bmax.data(), nb);
    // |f32 dot - dot| <= gamma_D |e| |k| (gamma_D = D u / (1 - D u), u = 2^-24, any summation
    // order, FMA or not); the unit keys, scaled by 1/|k| from an f32 norm, are within about
    // (D/2 + 3) u of unit length. slack bounds both with room; a key within twice that of the
    // row's best may be the best.
    const double u = std::ldexp(1.0, -24), slack = 1.25 * (1.5 * double(D) + 8) * u;
    for (int64_t j = 0; j < ne; ++j) {
        const float* e = s.e.data() + j * D;
        const double n_e = std::sqrt(exact_dot(e, e, D));
        double bc = -2;
        int32_t bi = -1;
        auto consider = [&](int64_t i) {
            const double c = exact_cos(e, n_e, kept_key(i), exact_norm(i), D);
            if (c > bc || (c == bc && i < bi)) bc = c, bi = int32_t(i);
        };
        if (!screenable(n_e)) {
            for (int64_t i = 0; i < nk; ++i) consider(i);
        } else {
            const float* dot = s.dots.data() + j * nc;
            const float* bm = s.bmax.data() + j * nb;
            float top = -std::numeric_limits<float>::infinity();
            for (int64_t b = 0; b < nb; ++b) top = std::max(top, bm[b]);
            const float cut = top - float(2 * slack * n_e);
            for (int64_t b = 0; b < nb; ++b) {
                if (!(bm[b] >= cut)) continue;
                for (int64_t c = b * kBlock; c < std::min(nc, (b + 1) * kBlock); ++c)
                    if (dot[c] >= cut) consider(s.cols[size_t(c)]);
            }
            for (int32_t i : special) consider(i);
        }
        best[j] = bi;
        cos[j] = bc;
    }
}

}  // namespace kv
