// SDPA_KIVI on the CPU: attention over a KIVI cache (kernels/common/kivi_math.h) with the
// dequantization fused into the read. A unit is one (batch, KV group, range of slot groups)
// for all R heads of the group; each slot group is decoded once (codes through a byte table,
// then one FMA per element) into an L1-resident K^T / V tile shared by every query of the unit, so no dequantized copy of the cache is ever
// formed. Units keep an online softmax (max, sum, weighted V) per query row; the ranges of a
// pair are merged at the end. Decode splits the keys of a pair into ranges so both cores
// share even one pair. Weight sums (dst2) take a second pass with the final max and sum.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "kernels/common/kivi_math.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

inline int32_t i32_at(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

struct KiviCall {
    int64_t B, NH, n, D, G, R, T, NG, S, VG, ngT, ranges;
    int bits, window;
    double alpha;
};

KiviCall kivi_call(const OpCall& c, int threads) {
    const TensorView &q = c.src[0], &kc = c.src[1], &vs = c.src[4], &kpos = c.src[7];
    KiviCall s{};
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.D = q.ne[3], s.G = kc.ne[1], s.NG = kc.ne[2];
    s.R = s.NH / s.G, s.T = kpos.ne[2], s.S = c.p.kivi_group, s.bits = c.p.kivi_bits, s.VG = s.D / vs.ne[3];
    s.window = c.p.window, s.alpha = c.p.alpha;
    s.ngT = (s.T + s.S - 1) / s.S;
    // Key ranges only for decode-sized calls: a prefill chunk has query rows enough to share.
    const int64_t pairs = s.B * s.G;
    s.ranges = s.n <= 4 ? std::max<int64_t>(1, std::min<int64_t>(s.ngT, (int64_t(threads) * 4 + pairs - 1) / pairs)) : 1;
    if (s.ngT == 0) s.ranges = 1;
    return s;
}

// Codes of a byte, as floats (2-bit: 4 codes, 4-bit: 2 codes, lowest bits first): unpacking
// is a table load instead of shifts and masks per code.
struct CodeTables {
    float c2[256][4];
    float c4[256][2];
    CodeTables() {
        for (int b = 0; b < 256; ++b) {
            for (int i = 0; i < 4; ++i) c2[b][i] = float((b >> (2 * i)) & 3);
            for (int i = 0; i < 2; ++i) c4[b][i] = float((b >> (4 * i)) & 15);
        }
    }
};
const CodeTables& code_tables() {
    static const CodeTables t;
    return t;
}

// n codes (n * bits a multiple of 8) of the byte run p, as floats.
inline void unpack_codes(const uint8_t* p, int64_t n, int bits, float* out) {
    const CodeTables& t = code_tables();
    if (bits == 2) {
        for (int64_t i = 0; i < n / 4; ++i) std::memcpy(out + 4 * i, t.c2[p[i]], 16);
    } else {
        for (int64_t i = 0; i < n / 2; ++i) std::memcpy(out + 2 * i, t.c4[p[i]], 8);
    }
}

// Decode slot group j of pair (b, g): keys transposed, Kt[d * S + t] (scores then run over
// contiguous t for every channel), values V[t * D + d]. Returns the group's slots below T.
template <class A>
int64_t load_group(const OpCall& c, const KiviCall& s, int64_t b, int64_t g, int64_t j, A* Kt, A* V, float* codes) {
    const TensorView &kc = c.src[1], &ks = c.src[2], &vc = c.src[3], &vs = c.src[4], &res = c.src[5], &map = c.src[6];
    const int64_t t0 = j * s.S, nt = std::min(s.S, s.T - t0);
    const int32_t blk = i32_at(map, b * map.nb[0] + g * map.nb[1] + j * map.nb[2]);
    if (blk >= 0) {  // full-precision residual group
        for (int64_t t = 0; t < nt; ++t) {
            load_row(res.bytes() + blk * res.nb[0] + t * res.nb[2], res.nb[3], res.dtype, s.D, V + t * s.D);  // staging
            for (int64_t d = 0; d < s.D; ++d) Kt[d * s.S + t] = V[t * s.D + d];
            load_row(res.bytes() + blk * res.nb[0] + res.nb[1] + t * res.nb[2], res.nb[3], res.dtype, s.D, V + t * s.D);
        }
        return nt;
    }
    const char* kcg = kc.bytes() + b * kc.nb[0] + g * kc.nb[1] + j * kc.nb[2];
    const char* ksg = ks.bytes() + b * ks.nb[0] + g * ks.nb[1] + j * ks.nb[2];
    for (int64_t d = 0; d < s.D; ++d) {
        unpack_codes(reinterpret_cast<const uint8_t*>(kcg + d * kc.nb[3]), s.S, s.bits, codes);
        const uint16_t* sc = reinterpret_cast<const uint16_t*>(ksg + d * ks.nb[3]);
        const float scale = h2f(sc[0]), mn = h2f(sc[1]);
        A* row = Kt + d * s.S;
#pragma omp simd
        for (int64_t t = 0; t < s.S; ++t) row[t] = A(mn + scale * codes[t]);
    }
    for (int64_t t = 0; t < nt; ++t) {
        unpack_codes(reinterpret_cast<const uint8_t*>(vc.bytes() + b * vc.nb[0] + g * vc.nb[1] + (t0 + t) * vc.nb[2]), s.D, s.bits, codes);
        const char* sr = vs.bytes() + b * vs.nb[0] + g * vs.nb[1] + (t0 + t) * vs.nb[2];
        A* row = V + t * s.D;
        for (int64_t vg = 0; vg < s.D / s.VG; ++vg) {
            const uint16_t* sc = reinterpret_cast<const uint16_t*>(sr + vg * vs.nb[3]);
            const float scale = h2f(sc[0]), mn = h2f(sc[1]);
#pragma omp simd
            for (int64_t d = vg * s.VG; d < (vg + 1) * s.VG; ++d) row[d] = A(mn + scale * codes[d]);
        }
    }
    return nt;
}

// Masked, scaled scores of one query row against a tile of nt keys; -inf where invisible.
template <class A>
void tile_scores(const KiviCall& s, const A* qrow, const A* Kt, const int32_t* kp, int64_t nt, int64_t qp, A* out) {
    const int64_t lo = s.window > 0 ? qp - s.window : std::numeric_limits<int64_t>::min();
    for (int64_t t = 0; t < nt; ++t) out[t] = 0;
    for (int64_t d = 0; d < s.D; ++d) {
        const A qd = qrow[d];
        const A* k = Kt + d * s.S;
#pragma omp simd
        for (int64_t t = 0; t < nt; ++t) out[t] += qd * k[t];
    }
    for (int64_t t = 0; t < nt; ++t)
        out[t] = kp[t] <= qp && kp[t] > lo ? A(s.alpha) * out[t] : -std::numeric_limits<A>::infinity();
}

template <class A>
void forward(const OpContext& ctx, const OpCall& c) {
    const int threads = ctx.threads > 0 ? ctx.threads : omp_get_max_threads();
    const KiviCall s = kivi_call(c, threads);
    const TensorView &q = c.src[0], &kpos = c.src[7], &qpos = c.src[8], &y = c.dst;
    const int64_t rows = s.R * s.n;                    // query rows of one pair
    const int64_t units = s.B * s.G * s.ranges;
    const int64_t state = rows * (s.D + 2);            // per unit: max, sum, weighted V
    std::vector<A> st(size_t(units * state));
    std::vector<A> qbuf(size_t(s.B * s.NH * s.n * s.D));
    for (int64_t b = 0; b < s.B; ++b)
        for (int64_t h = 0; h < s.NH; ++h)
            for (int64_t i = 0; i < s.n; ++i)
                load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, s.D,
                         qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D);
    auto group_range = [&](int64_t r, int64_t* j0, int64_t* j1) {
        *j0 = s.ngT * r / s.ranges;
        *j1 = s.ngT * (r + 1) / s.ranges;
    };
    auto kp_of = [&](int64_t b, int64_t g, int64_t j, int64_t nt, int32_t* kp) {
        const int64_t kb = kpos.ne[0] == 1 ? 0 : b, kg = kpos.ne[1] == 1 ? 0 : g;
        for (int64_t t = 0; t < nt; ++t) kp[t] = i32_at(kpos, kb * kpos.nb[0] + kg * kpos.nb[1] + (j * s.S + t) * kpos.nb[2]);
    };
    auto qp_of = [&](int64_t b, int64_t i) { return int64_t(i32_at(qpos, (qpos.ne[0] == 1 ? 0 : b) * qpos.nb[0] + i * qpos.nb[1])); };

    run_units(threads, units, [&](int64_t u) {
        const int64_t pair = u / s.ranges, r = u % s.ranges, b = pair / s.G, g = pair % s.G;
        A* m = st.data() + u * state;
        A* l = m + rows;
        A* acc = l + rows;
        std::fill(m, m + rows, -std::numeric_limits<A>::infinity());
        std::fill(l, l + rows, A(0));
        std::fill(acc, acc + rows * s.D, A(0));
        std::vector<A> K(size_t(s.S * s.D)), V(size_t(s.S * s.D)), sc(size_t(s.S));
        std::vector<float> codes(size_t(std::max(s.S, s.D)));
        std::vector<int32_t> kp(size_t(s.S));
        int64_t j0, j1;
        group_range(r, &j0, &j1);
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t nt = load_group(c, s, b, g, j, K.data(), V.data(), codes.data());
            kp_of(b, g, j, nt, kp.data());
            for (int64_t row = 0; row < rows; ++row) {
                const int64_t h = g * s.R + row / s.n, i = row % s.n;
                tile_scores(s, qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D, K.data(), kp.data(), nt, qp_of(b, i), sc.data());
                A mx = m[row];
                for (int64_t t = 0; t < nt; ++t) mx = std::max(mx, sc[size_t(t)]);
                if (mx == -std::numeric_limits<A>::infinity()) continue;
                const A corr = std::exp(m[row] - mx);  // exp(-inf) = 0 for the first visible key
                A* a = acc + row * s.D;
                l[row] *= corr;
                for (int64_t d = 0; d < s.D; ++d) a[d] *= corr;
                for (int64_t t = 0; t < nt; ++t) {
                    if (sc[size_t(t)] == -std::numeric_limits<A>::infinity()) continue;
                    const A p = std::exp(sc[size_t(t)] - mx);
                    l[row] += p;
                    const A* v = V.data() + t * s.D;
#pragma omp simd
                    for (int64_t d = 0; d < s.D; ++d) a[d] += p * v[d];
                }
                m[row] = mx;
            }
        }
    });

    // Merge the ranges of each pair into the output; keep the final max and sum for weights.
    std::vector<A> fin(size_t(s.B * s.G * rows * 2));
    std::vector<A> out(size_t(s.D));
    for (int64_t pair = 0; pair < s.B * s.G; ++pair) {
        const int64_t b = pair / s.G, g = pair % s.G;
        for (int64_t row = 0; row < rows; ++row) {
            A M = -std::numeric_limits<A>::infinity();
            for (int64_t r = 0; r < s.ranges; ++r) M = std::max(M, st[size_t((pair * s.ranges + r) * state + row)]);
            A L = 0;
            std::fill(out.begin(), out.end(), A(0));
            if (M != -std::numeric_limits<A>::infinity())
                for (int64_t r = 0; r < s.ranges; ++r) {
                    const A* m = st.data() + (pair * s.ranges + r) * state;
                    if (m[row] == -std::numeric_limits<A>::infinity()) continue;
                    const A f = std::exp(m[row] - M);
                    L += m[rows + row] * f;
                    const A* a = m + 2 * rows + row * s.D;
                    for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] += a[d] * f;
                }
            for (int64_t d = 0; d < s.D; ++d) out[size_t(d)] = L > 0 ? out[size_t(d)] / L : A(0);
            const int64_t h = g * s.R + row / s.n, i = row % s.n;
            store_row(y.bytes() + b * y.nb[0] + h * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, s.D, out.data());
            fin[size_t((pair * rows + row) * 2)] = M;
            fin[size_t((pair * rows + row) * 2 + 1)] = L;
        }
    }
    if (!c.dst2.data) return;

    const TensorView& w = c.dst2;
    run_units(threads, units, [&](int64_t u) {
        const int64_t pair = u / s.ranges, r = u % s.ranges, b = pair / s.G, g = pair % s.G;
        std::vector<A> K(size_t(s.S * s.D)), V(size_t(s.S * s.D)), sc(size_t(s.S)), ws(size_t(s.S));
        std::vector<float> codes(size_t(std::max(s.S, s.D)));
        std::vector<int32_t> kp(size_t(s.S));
        int64_t j0, j1;
        group_range(r, &j0, &j1);
        for (int64_t j = j0; j < j1; ++j) {
            const int64_t nt = load_group(c, s, b, g, j, K.data(), V.data(), codes.data());
            kp_of(b, g, j, nt, kp.data());
            std::fill(ws.begin(), ws.end(), A(0));
            for (int64_t row = 0; row < rows; ++row) {
                const A M = fin[size_t((pair * rows + row) * 2)], L = fin[size_t((pair * rows + row) * 2 + 1)];
                if (!(L > 0)) continue;
                const int64_t h = g * s.R + row / s.n, i = row % s.n;
                tile_scores(s, qbuf.data() + ((b * s.NH + h) * s.n + i) * s.D, K.data(), kp.data(), nt, qp_of(b, i), sc.data());
                for (int64_t t = 0; t < nt; ++t)
                    if (sc[size_t(t)] != -std::numeric_limits<A>::infinity()) ws[size_t(t)] += std::exp(sc[size_t(t)] - M) / L;
            }
            for (int64_t t = 0; t < nt; ++t) ws[size_t(t)] /= A(s.R);
            store_row(w.bytes() + b * w.nb[0] + g * w.nb[1] + j * s.S * w.nb[2], w.nb[2], w.dtype, nt, ws.data());
        }
    });
}

}  // namespace

void sdpa_kivi_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) forward<double>(ctx, c);
    else forward<float>(ctx, c);
}

}  // namespace kv::cpu
