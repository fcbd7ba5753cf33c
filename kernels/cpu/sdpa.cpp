// SDPA on the CPU, flash-style: per (batch, KV group, query block) task, key blocks are
// streamed with an online softmax (running max m, denominator l, accumulator acc), so no
// (n, T) matrix exists beyond one query block. When attention-weight sums are requested the
// block's raw scores are kept (query block sized so they stay ~4 MiB) and normalised in a
// second pass with the final m and l: w[b,g,j] += exp(s_ij - m_i) / l_i / R.
// Heads of one group share the converted K/V block (GQA), which matters for bf16/quantized K/V.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {

constexpr int64_t kKeyBlock = 128;
constexpr int64_t kScoreBudget = int64_t(1) << 20;  // floats of kept scores per task (4 MiB)

inline int32_t read_i32(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

template <class A>
struct SdpaShape {
    int64_t B, NH, n, HS, G, T, R, Bq;
    A alpha;
    int window;
    bool weights;
};

// One task: batch b, group g, queries [i0, i1) for all R heads of the group.
// w_out: (T) accumulator for (b, g) (may be shared by tasks of other query blocks only when
// it is a per-thread partial buffer).
template <class A>
void sdpa_task(const OpCall& c, const SdpaShape<A>& s, int64_t b, int64_t g, int64_t i0, int64_t i1, A* w_out) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4];
    const TensorView& y = c.dst;
    const int64_t HS = s.HS, T = s.T, R = s.R, nq = i1 - i0, rows = R * nq;
    const A neg_inf = -std::numeric_limits<A>::infinity();

    A* qs = scratch<A>(0, rows * HS);               // scaled queries, row = r * nq + i
    A* acc = scratch<A>(1, rows * HS + 2 * rows);    // accumulators, then m and l
    A* m = acc + rows * HS;
    A* l = m + rows;
    // K^T block, V block, scores, key positions (as A; exact below 2^24), one staging row.
    A* kt = scratch<A>(2, HS * kKeyBlock + kKeyBlock * HS + kKeyBlock * 2 + HS);
    A* vb = kt + HS * kKeyBlock;
    A* sc = vb + kKeyBlock * HS;
    A* kp = sc + kKeyBlock;
    A* stage = kp + kKeyBlock;
    A* kept = s.weights ? scratch<A>(3, rows * T) : nullptr;

    const int64_t qpb = qpos.ne[0] == 1 ? 0 : b;
    const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g;
    std::vector<int32_t> qp((size_t)nq);
    for (int64_t i = 0; i < nq; ++i) qp[size_t(i)] = read_i32(qpos, qpb * qpos.nb[0] + (i0 + i) * qpos.nb[1]);

    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        for (int64_t i = 0; i < nq; ++i) {
            A* qr = qs + (r * nq + i) * HS;
            load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + (i0 + i) * q.nb[2], q.nb[3], q.dtype, HS, qr);
            for (int64_t d = 0; d < HS; ++d) qr[d] *= s.alpha;
        }
    }
    std::fill(acc, acc + rows * HS, A(0));
    std::fill(m, m + rows, neg_inf);
    std::fill(l, l + rows, A(0));

    const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
    const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
    int32_t q_lo = qp.empty() ? 0 : qp[0], q_hi = q_lo;
    for (int32_t p : qp) q_lo = std::min(q_lo, p), q_hi = std::max(q_hi, p);
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, T - j0);
        // Skip key blocks no query of this block can see (causal prefill: about half of them).
        {
            int32_t k_lo = INT32_MAX, k_hi = INT32_MIN;
            for (int64_t j = 0; j < nk; ++j) {
                const int32_t p = read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (j0 + j) * kpos.nb[2]);
                k_lo = std::min(k_lo, p), k_hi = std::max(k_hi, p);
            }
            const bool after_all = k_lo > q_hi;
            const bool before_window = s.window > 0 && int64_t(k_hi) <= int64_t(q_lo) - s.window;
            if (after_all || before_window) {
                if (kept)
                    for (int64_t row_i = 0; row_i < rows; ++row_i) std::fill(kept + row_i * T + j0, kept + row_i * T + j0 + nk, neg_inf);
                continue;
            }
        }
        // Convert the K block transposed (kt[d * nk + j]) and the V block (vb[j * HS + d]).
        for (int64_t j = 0; j < nk; ++j) {
            load_row(kbase + (j0 + j) * k.nb[2], k.nb[3], k.dtype, HS, stage);
            for (int64_t d = 0; d < HS; ++d) kt[d * nk + j] = stage[d];
            load_row(vbase + (j0 + j) * v.nb[2], v.nb[3], v.dtype, HS, vb + j * HS);
            kp[j] = A(read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (j0 + j) * kpos.nb[2]));
        }
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t i = 0; i < nq; ++i) {
                const int64_t row_i = r * nq + i;
                const A* qr = qs + row_i * HS;
                // s[j] = q . k_j  (vectorised over j)
                for (int64_t j = 0; j < nk; ++j) sc[j] = 0;
                for (int64_t d = 0; d < HS; ++d) {
                    const A qd = qr[d];
                    const A* ktd = kt + d * nk;
                    for (int64_t j = 0; j < nk; ++j) sc[j] += qd * ktd[j];
                }
                const A qpos_i = A(qp[size_t(i)]);
                const A lo = s.window > 0 ? qpos_i - A(s.window) : neg_inf;
                A mb = neg_inf;
                for (int64_t j = 0; j < nk; ++j) {
                    const bool ok = kp[j] <= qpos_i && kp[j] > lo;
                    sc[j] = ok ? sc[j] : neg_inf;
                    mb = sc[j] > mb ? sc[j] : mb;
                }
                if (kept) std::copy(sc, sc + nk, kept + row_i * T + j0);
                if (mb == neg_inf) continue;  // nothing visible in this block
                const A m_new = std::max(m[row_i], mb);
                const A corr = m[row_i] == neg_inf ? A(0) : kv_exp(m[row_i] - m_new);
                A* ar = acc + row_i * HS;
                A lsum = 0;
                for (int64_t j = 0; j < nk; ++j) {
                    sc[j] = kv_exp(sc[j] - m_new);
                    lsum += sc[j];
                }
                l[row_i] = l[row_i] * corr + lsum;
                m[row_i] = m_new;
                for (int64_t d = 0; d < HS; ++d) ar[d] *= corr;
                for (int64_t j = 0; j < nk; ++j) {
                    const A p = sc[j];
                    if (p == A(0)) continue;
                    const A* vr = vb + j * HS;
                    for (int64_t d = 0; d < HS; ++d) ar[d] += p * vr[d];
                }
            }
        }
    }
    // Outputs.
    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t row_i = r * nq + i;
            A* ar = acc + row_i * HS;
            const A inv = l[row_i] > A(0) ? A(1) / l[row_i] : A(0);
            for (int64_t d = 0; d < HS; ++d) ar[d] *= inv;
            store_row(y.bytes() + b * y.nb[0] + h * y.nb[1] + (i0 + i) * y.nb[2], y.nb[3], y.dtype, HS, ar);
        }
    }
    if (kept) {
        const A inv_r = A(1) / A(R);
        for (int64_t row_i = 0; row_i < rows; ++row_i) {
            if (!(l[row_i] > A(0))) continue;
            const A mi = m[row_i], f = inv_r / l[row_i];
            const A* kr = kept + row_i * T;
            for (int64_t j = 0; j < T; ++j) w_out[j] += kv_exp(kr[j] - mi) * f;
        }
    }
}

template <class A>
void sdpa_run(const OpContext& ctx, const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1];
    SdpaShape<A> s;
    s.B = q.ne[0];
    s.NH = q.ne[1];
    s.n = q.ne[2];
    s.HS = q.ne[3];
    s.G = k.ne[1];
    s.T = k.ne[2];
    s.R = s.NH / s.G;
    s.alpha = A(c.p.alpha);
    s.window = c.p.window;
    s.weights = c.dst2.data != nullptr;
    s.Bq = 32;
    if (s.weights && s.T > 0) s.Bq = std::max<int64_t>(1, std::min<int64_t>(32, kScoreBudget / (s.R * s.T)));
    s.Bq = std::min<int64_t>(s.Bq, std::max<int64_t>(s.n, 1));
    const int64_t nqb = (s.n + s.Bq - 1) / s.Bq;
    const int64_t pairs = s.B * s.G, tasks = pairs * nqb;
    if (tasks == 0) return;
    const int threads = std::max(1, ctx.threads > 0 ? ctx.threads : omp_get_max_threads());

    // Weight sums: (b, g) rows of length T. When every thread owns whole (b, g) pairs the
    // result is written directly; otherwise each thread accumulates a private copy.
    const bool by_pair = pairs >= threads || !s.weights;
    const int nt = int(std::min<int64_t>(threads, by_pair ? pairs : tasks));
    std::vector<A> partial;
    if (s.weights) partial.assign(size_t(by_pair ? 1 : nt) * size_t(pairs * s.T), A(0));

    auto run_pair_range = [&](int64_t p0, int64_t p1, A* wbase) {
        for (int64_t p = p0; p < p1; ++p) {
            const int64_t b = p / s.G, g = p % s.G;
            for (int64_t qb = 0; qb < nqb; ++qb)
                sdpa_task<A>(c, s, b, g, qb * s.Bq, std::min(s.n, (qb + 1) * s.Bq), wbase ? wbase + p * s.T : nullptr);
        }
    };
    if (by_pair) {
        A* wbase = s.weights ? partial.data() : nullptr;
        if (nt <= 1) {
            run_pair_range(0, pairs, wbase);
        } else {
#pragma omp parallel num_threads(nt)
            {
                const int t = omp_get_thread_num(), n = omp_get_num_threads();
                run_pair_range(pairs * t / n, pairs * (t + 1) / n, wbase);
            }
        }
    } else {
#pragma omp parallel num_threads(nt)
        {
            const int t = omp_get_thread_num(), n = omp_get_num_threads();
            A* wbase = partial.data() + size_t(t) * size_t(pairs * s.T);
            for (int64_t task = tasks * t / n; task < tasks * (t + 1) / n; ++task) {
                const int64_t p = task / nqb, qb = task % nqb;
                const int64_t b = p / s.G, g = p % s.G;
                sdpa_task<A>(c, s, b, g, qb * s.Bq, std::min(s.n, (qb + 1) * s.Bq), wbase + p * s.T);
            }
        }
        for (int t = 1; t < nt; ++t) {
            const A* src = partial.data() + size_t(t) * size_t(pairs * s.T);
            for (int64_t e = 0; e < pairs * s.T; ++e) partial[size_t(e)] += src[e];
        }
    }
    if (s.weights) {
        const TensorView& w = c.dst2;
        for (int64_t p = 0; p < pairs; ++p) {
            const int64_t b = p / s.G, g = p % s.G;
            store_row(w.bytes() + b * w.nb[0] + g * w.nb[1], w.nb[2], w.dtype, s.T, partial.data() + p * s.T);
        }
    }
}

}  // namespace

void sdpa_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) sdpa_run<double>(ctx, c);
    else sdpa_run<float>(ctx, c);
}

}  // namespace kv::cpu
