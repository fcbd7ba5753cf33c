// SDPA_QUEST on the CPU: attention over the pages each query selects (kernels/common/
// quest_math.h). A unit is one query row (b, h, i): it bounds every visible page from the
// page min/max keys, keeps the top pages, and runs an online softmax over their slots only,
// reading K and V in place (no gather). The unread pages are what the policy saves: at 1/8
// of the pages with 16-slot pages a decode step reads 2/16 (metadata) + 2/8 (selected K, V)
// of what dense attention reads. Weight sums (dst2) take a second pass per (b, g) with each
// row's final max and sum, so rows of one group never write the same slot concurrently.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "kernels/common/online_softmax.h"
#include "kernels/common/quest_math.h"
#include "unit_pool.h"

namespace kv::cpu {

namespace {

inline int32_t i32_at(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

struct QuestCall {
    int64_t B, NH, n, D, G, R, T, P, NP, K;
    double alpha;
};

// Score of one slot: (alpha q) . k over D channels.
template <class A>
inline A dot(const A* q, const A* k, int64_t D) {
    A s = A(0);
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < D; ++d) s += q[d] * k[d];
    return s;
}

// The page bound in the kernel's precision (the formula of quest_page_bound, vectorized).
template <class A>
inline A bound(const A* q, const float* mn, const float* mx, int64_t D) {
    A u = A(0);
#pragma omp simd reduction(+ : u)
    for (int64_t d = 0; d < D; ++d) {
        const A a = q[d] * A(mn[d]), b = q[d] * A(mx[d]);
        u += a > b ? a : b;
    }
    return u;
}

template <class A>
void forward(const OpContext& ctx, const OpCall& c) {
    const int threads = ctx.threads > 0 ? ctx.threads : omp_get_max_threads();
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4], &mn = c.src[5],
                     &mx = c.src[6], &y = c.dst;
    QuestCall s{};
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.D = q.ne[3], s.G = k.ne[1], s.T = k.ne[2];
    s.R = s.NH / s.G, s.P = c.p.quest_page, s.NP = (s.T + s.P - 1) / s.P, s.K = c.p.quest_pages, s.alpha = c.p.alpha;
    const int64_t rows = s.B * s.NH * s.n, maxsel = s.K + 1;
    std::vector<A> sinks;  // src7: a sink logit per head in every denominator (gpt-oss), or none
    if (has_src(c, 7)) {
        sinks.resize(size_t(s.NH));
        load_row(c.src[7].bytes(), c.src[7].nb[0], c.src[7].dtype, s.NH, sinks.data());
    }

    // First position of every page per kpos row: a page is visible to a query that may see
    // its first slot (positions are nondecreasing along the slots).
    const int64_t kb = kpos.ne[0], kg = kpos.ne[1];
    std::vector<int32_t> first((size_t)(kb * kg * s.NP));
    for (int64_t r = 0; r < kb * kg; ++r)
        for (int64_t j = 0; j < s.NP; ++j)
            first[size_t(r * s.NP + j)] = i32_at(kpos, (r / kg) * kpos.nb[0] + (r % kg) * kpos.nb[1] + j * s.P * kpos.nb[2]);
    auto kp_row = [&](int64_t b, int64_t g) { return (kb == 1 ? 0 : b) * kg + (kg == 1 ? 0 : g); };
    auto kp_at = [&](int64_t b, int64_t g, int64_t t) {
        return i32_at(kpos, (kb == 1 ? 0 : b) * kpos.nb[0] + (kg == 1 ? 0 : g) * kpos.nb[1] + t * kpos.nb[2]);
    };
    auto qp_at = [&](int64_t b, int64_t i) { return i32_at(qpos, (qpos.ne[0] == 1 ? 0 : b) * qpos.nb[0] + i * qpos.nb[1]); };
    const bool kn = (sizeof(A) == 4 ? k.dtype == DType::F32 : k.dtype == DType::F64) && k.nb[3] == int64_t(sizeof(A));
    const bool vn = (sizeof(A) == 4 ? v.dtype == DType::F32 : v.dtype == DType::F64) && v.nb[3] == int64_t(sizeof(A));

    std::vector<int32_t> sel((size_t)(rows * maxsel), -1);
    std::vector<A> fin((size_t)(rows * 2));  // final max and sum per row
    run_units(threads, rows, [&](int64_t u) {
        const int64_t b = u / (s.NH * s.n), h = (u / s.n) % s.NH, i = u % s.n, g = h / s.R;
        std::vector<A> qs((size_t)(s.D)), acc((size_t)(s.D), A(0)), kr((size_t)(s.D)), vr((size_t)(s.D)), ub((size_t)(s.NP)), sc((size_t)(s.P));
        std::vector<int32_t> scratch;
        load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, s.D, qs.data());
        const int32_t qp = qp_at(b, i);
        const int32_t* fp = first.data() + kp_row(b, g) * s.NP;
        int64_t nv = 0;
        while (nv < s.NP && fp[nv] <= qp) ++nv;
        // Bounds of the unscaled q (alpha > 0 keeps the order); the forced page is the last visible.
        const char* mnb = mn.bytes() + b * mn.nb[0] + g * mn.nb[1];
        const char* mxb = mx.bytes() + b * mx.nb[0] + g * mx.nb[1];
        if (s.K < nv)
            for (int64_t j = 0; j < nv; ++j)
                ub[size_t(j)] = bound(qs.data(), reinterpret_cast<const float*>(mnb + j * mn.nb[2]),
                                      reinterpret_cast<const float*>(mxb + j * mx.nb[2]), s.D);
        int32_t* su = sel.data() + u * maxsel;
        const int64_t ns = quest_select(ub.data(), nv, s.K, nv - 1, su, scratch);
        for (int64_t d = 0; d < s.D; ++d) qs[size_t(d)] *= A(s.alpha);
        A m = -std::numeric_limits<A>::infinity(), l = A(0);
        const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
        const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
        for (int64_t e = 0; e < ns; ++e) {
            const int64_t t0 = int64_t(su[e]) * s.P, nt = std::min(s.P, s.T - t0);
            A pm = -std::numeric_limits<A>::infinity();
            for (int64_t t = 0; t < nt; ++t) {
                if (kp_at(b, g, t0 + t) > qp) {
                    sc[size_t(t)] = -std::numeric_limits<A>::infinity();
                    continue;
                }
                const char* kp = kbase + (t0 + t) * k.nb[2];
                const A* krow = kn ? reinterpret_cast<const A*>(kp) : (load_row(kp, k.nb[3], k.dtype, s.D, kr.data()), kr.data());
                sc[size_t(t)] = dot(qs.data(), krow, s.D);
                pm = std::max(pm, sc[size_t(t)]);
            }
            if (pm == -std::numeric_limits<A>::infinity()) continue;
            const A corr = online_softmax_raise(m, l, pm, LibmExp{});
            for (int64_t d = 0; d < s.D; ++d) acc[size_t(d)] *= corr;
            for (int64_t t = 0; t < nt; ++t) {
                if (sc[size_t(t)] == -std::numeric_limits<A>::infinity()) continue;
                const A p = std::exp(sc[size_t(t)] - m);
                l += p;
                const char* vp = vbase + (t0 + t) * v.nb[2];
                const A* vrow = vn ? reinterpret_cast<const A*>(vp) : (load_row(vp, v.nb[3], v.dtype, s.D, vr.data()), vr.data());
                A* a = acc.data();
#pragma omp simd
                for (int64_t d = 0; d < s.D; ++d) a[d] += p * vrow[d];
            }
        }
        if (!sinks.empty()) {  // the sink joins the max and sum (it has no value)
            const A f = online_softmax_sink(m, l, sinks[size_t(h)], LibmExp{});
            for (int64_t d = 0; d < s.D; ++d) acc[size_t(d)] *= f;
        }
        for (int64_t d = 0; d < s.D; ++d) acc[size_t(d)] = l > 0 ? acc[size_t(d)] / l : A(0);
        store_row(y.bytes() + b * y.nb[0] + h * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, s.D, acc.data());
        fin[size_t(u * 2)] = m;
        fin[size_t(u * 2 + 1)] = l;
    });

    if (c.dst3.data) {
        const TensorView& o = c.dst3;
        for (int64_t u = 0; u < rows; ++u) {
            const int64_t b = u / (s.NH * s.n), h = (u / s.n) % s.NH, i = u % s.n;
            for (int64_t e = 0; e < maxsel; ++e)
                *reinterpret_cast<int32_t*>(o.bytes() + b * o.nb[0] + h * o.nb[1] + i * o.nb[2] + e * o.nb[3]) = sel[size_t(u * maxsel + e)];
        }
    }
    if (!c.dst2.data) return;

    const TensorView& w = c.dst2;
    run_units(threads, s.B * s.G, [&](int64_t pair) {
        const int64_t b = pair / s.G, g = pair % s.G;
        std::vector<A> ws((size_t)(s.T), A(0)), qs((size_t)(s.D)), kr((size_t)(s.D));
        const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
        for (int64_t h = g * s.R; h < (g + 1) * s.R; ++h)
            for (int64_t i = 0; i < s.n; ++i) {
                const int64_t u = (b * s.NH + h) * s.n + i;
                const A M = fin[size_t(u * 2)], L = fin[size_t(u * 2 + 1)];
                if (!(L > 0)) continue;
                load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, s.D, qs.data());
                for (int64_t d = 0; d < s.D; ++d) qs[size_t(d)] *= A(s.alpha);
                const int32_t qp = qp_at(b, i);
                for (int64_t e = 0; e < maxsel && sel[size_t(u * maxsel + e)] >= 0; ++e) {
                    const int64_t t0 = int64_t(sel[size_t(u * maxsel + e)]) * s.P, nt = std::min(s.P, s.T - t0);
                    for (int64_t t = t0; t < t0 + nt; ++t) {
                        if (kp_at(b, g, t) > qp) continue;
                        const char* kp = kbase + t * k.nb[2];
                        const A* krow = kn ? reinterpret_cast<const A*>(kp) : (load_row(kp, k.nb[3], k.dtype, s.D, kr.data()), kr.data());
                        ws[size_t(t)] += std::exp(dot(qs.data(), krow, s.D) - M) / L;
                    }
                }
            }
        for (int64_t t = 0; t < s.T; ++t) ws[size_t(t)] /= A(s.R);
        store_row(w.bytes() + b * w.nb[0] + g * w.nb[1], w.nb[2], w.dtype, s.T, ws.data());
    });
}

}  // namespace

void sdpa_quest_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) forward<double>(ctx, c);
    else forward<float>(ctx, c);
}

}  // namespace kv::cpu
