// Kernel lab for the CPU SDPA (STYLE item 7): a standalone program, not part of the product.
// Versions:
//   v1  the original flash-style kernel: per-task K/V block reconversion, per-row axpy loops
//       over memory-resident score and accumulator rows, weights by re-exponentiating kept scores
//   v2  (kernels/cpu/sdpa.cpp) K^T converted once per (pair, thread) into one (HS, 128) panel
//       per key block, f32 V read in place, Q.K^T and P.V through 8x32 register tiles
//       (gemm_tile.h), weights from the kept probabilities with one exp per (row, key block),
//       static work-balanced task split, causal/window block skip kept.
//       Tried on the way and measured worse: 4x64 tiles (~20% slower: B reloads), (HS, T)
//       layouts for K^T, P and dP (2-3x slower products: rows 4*T bytes apart share cache sets),
//       key blocks of 64 or 256 (more rescaling / panels falling out of L1).
//   v3  (kernels/cpu/sdpa.cpp, decode section) n <= 4 queries: no K^T copy; scores as dot
//       products on K in place, P.V through gemv_tile.h, 512-key ranges per work unit
//       merged in order. The "decode" shape below runs it under the v2 label (the backend
//       picks it). It replaced v2's per-call conversion of the whole cache into K^T panels,
//       and v2's split by (pair, query block), which for one query leaves threads idle or
//       unbalanced when G is not a multiple of the thread count (smollm2-135m decode at 4096:
//       attention and the small ops per layer ~2.7 -> ~1.3 ms, measured in one session).
// Every version is checked against the f64 reference on small shapes, then timed on model
// shapes with and without attention-weight sums. The backward (v2 only) is timed as well.
// Usage: kvlab_lab_sdpa [--quick] [--threads N]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/element_math.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/lab/lab_common.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/ref/ref_ops.h"

namespace kv::lab {

// =========================================================================================
// v1: the kernel as it was before v2 (kept verbatim in behaviour for comparison)
// =========================================================================================
namespace v1 {
using namespace kv::cpu;
constexpr int64_t kKeyBlock = 128;
constexpr int64_t kScoreBudget = int64_t(1) << 20;

inline int32_t read_i32(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

struct Shape {
    int64_t B, NH, n, HS, G, T, R, Bq;
    float alpha;
    int window;
    bool weights;
};

void task(const OpCall& c, const Shape& s, int64_t b, int64_t g, int64_t i0, int64_t i1, float* w_out) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4];
    const TensorView& y = c.dst;
    const int64_t HS = s.HS, T = s.T, R = s.R, nq = i1 - i0, rows = R * nq;
    const float neg_inf = -std::numeric_limits<float>::infinity();
    float* qs = scratch<float>(0, rows * HS);
    float* acc = scratch<float>(1, rows * HS + 2 * rows);
    float* m = acc + rows * HS;
    float* l = m + rows;
    float* kt = scratch<float>(2, HS * kKeyBlock + kKeyBlock * HS + kKeyBlock * 2 + HS);
    float* vb = kt + HS * kKeyBlock;
    float* sc = vb + kKeyBlock * HS;
    float* kp = sc + kKeyBlock;
    float* stage = kp + kKeyBlock;
    float* kept = s.weights ? scratch<float>(3, rows * T) : nullptr;
    const int64_t qpb = qpos.ne[0] == 1 ? 0 : b;
    const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g;
    std::vector<int32_t> qp((size_t)nq);
    for (int64_t i = 0; i < nq; ++i) qp[size_t(i)] = read_i32(qpos, qpb * qpos.nb[0] + (i0 + i) * qpos.nb[1]);
    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        for (int64_t i = 0; i < nq; ++i) {
            float* qr = qs + (r * nq + i) * HS;
            load_row(q.bytes() + b * q.nb[0] + h * q.nb[1] + (i0 + i) * q.nb[2], q.nb[3], q.dtype, HS, qr);
            for (int64_t d = 0; d < HS; ++d) qr[d] *= s.alpha;
        }
    }
    std::fill(acc, acc + rows * HS, 0.0f);
    std::fill(m, m + rows, neg_inf);
    std::fill(l, l + rows, 0.0f);
    const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
    const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
    int32_t q_lo = qp.empty() ? 0 : qp[0], q_hi = q_lo;
    for (int32_t p : qp) q_lo = std::min(q_lo, p), q_hi = std::max(q_hi, p);
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, T - j0);
        int32_t k_lo = INT32_MAX, k_hi = INT32_MIN;
        for (int64_t j = 0; j < nk; ++j) {
            const int32_t p = read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (j0 + j) * kpos.nb[2]);
            k_lo = std::min(k_lo, p), k_hi = std::max(k_hi, p);
        }
        if (k_lo > q_hi || (s.window > 0 && int64_t(k_hi) <= int64_t(q_lo) - s.window)) {
            if (kept)
                for (int64_t row_i = 0; row_i < rows; ++row_i) std::fill(kept + row_i * T + j0, kept + row_i * T + j0 + nk, neg_inf);
            continue;
        }
        for (int64_t j = 0; j < nk; ++j) {
            load_row(kbase + (j0 + j) * k.nb[2], k.nb[3], k.dtype, HS, stage);
            for (int64_t d = 0; d < HS; ++d) kt[d * nk + j] = stage[d];
            load_row(vbase + (j0 + j) * v.nb[2], v.nb[3], v.dtype, HS, vb + j * HS);
            kp[j] = float(read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (j0 + j) * kpos.nb[2]));
        }
        for (int64_t row_i = 0; row_i < rows; ++row_i) {
            const int64_t i = row_i % nq;
            const float* qr = qs + row_i * HS;
            for (int64_t j = 0; j < nk; ++j) sc[j] = 0;
            for (int64_t d = 0; d < HS; ++d) {
                const float qd = qr[d];
                const float* ktd = kt + d * nk;
                for (int64_t j = 0; j < nk; ++j) sc[j] += qd * ktd[j];
            }
            const float qpos_i = float(qp[size_t(i)]);
            const float lo = s.window > 0 ? qpos_i - float(s.window) : neg_inf;
            float mb = neg_inf;
            for (int64_t j = 0; j < nk; ++j) {
                const bool ok = kp[j] <= qpos_i && kp[j] > lo;
                sc[j] = ok ? sc[j] : neg_inf;
                mb = sc[j] > mb ? sc[j] : mb;
            }
            if (kept) std::copy(sc, sc + nk, kept + row_i * T + j0);
            if (mb == neg_inf) continue;
            const float m_new = std::max(m[row_i], mb);
            const float corr = m[row_i] == neg_inf ? 0.0f : kv_exp(m[row_i] - m_new);
            float* ar = acc + row_i * HS;
            float lsum = 0;
            for (int64_t j = 0; j < nk; ++j) {
                sc[j] = kv_exp(sc[j] - m_new);
                lsum += sc[j];
            }
            l[row_i] = l[row_i] * corr + lsum;
            m[row_i] = m_new;
            for (int64_t d = 0; d < HS; ++d) ar[d] *= corr;
            for (int64_t j = 0; j < nk; ++j) {
                const float p = sc[j];
                if (p == 0.0f) continue;
                const float* vr = vb + j * HS;
                for (int64_t d = 0; d < HS; ++d) ar[d] += p * vr[d];
            }
        }
    }
    for (int64_t r = 0; r < R; ++r) {
        const int64_t h = g * R + r;
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t row_i = r * nq + i;
            float* ar = acc + row_i * HS;
            const float inv = l[row_i] > 0.0f ? 1.0f / l[row_i] : 0.0f;
            for (int64_t d = 0; d < HS; ++d) ar[d] *= inv;
            store_row(y.bytes() + b * y.nb[0] + h * y.nb[1] + (i0 + i) * y.nb[2], y.nb[3], y.dtype, HS, ar);
        }
    }
    if (kept) {
        const float inv_r = 1.0f / float(R);
        for (int64_t row_i = 0; row_i < rows; ++row_i) {
            if (!(l[row_i] > 0.0f)) continue;
            const float mi = m[row_i], f = inv_r / l[row_i];
            const float* kr = kept + row_i * T;
            for (int64_t j = 0; j < T; ++j) w_out[j] += kv_exp(kr[j] - mi) * f;
        }
    }
}

void run(const OpCall& c, int threads) {
    const TensorView &q = c.src[0], &k = c.src[1];
    Shape s;
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.HS = q.ne[3], s.G = k.ne[1], s.T = k.ne[2];
    s.R = s.NH / s.G;
    s.alpha = c.p.alpha;
    s.window = c.p.window;
    s.weights = c.dst2.data != nullptr;
    s.Bq = 32;
    if (s.weights && s.T > 0) s.Bq = std::max<int64_t>(1, std::min<int64_t>(32, kScoreBudget / (s.R * s.T)));
    s.Bq = std::min<int64_t>(s.Bq, std::max<int64_t>(s.n, 1));
    const int64_t nqb = (s.n + s.Bq - 1) / s.Bq, pairs = s.B * s.G, tasks = pairs * nqb;
    const bool by_pair = pairs >= threads || !s.weights;
    const int nt = int(std::min<int64_t>(threads, by_pair ? pairs : tasks));
    std::vector<float> partial;
    if (s.weights) partial.assign(size_t(by_pair ? 1 : nt) * size_t(pairs * s.T), 0.0f);
    auto pair_range = [&](int64_t p0, int64_t p1, float* wbase) {
        for (int64_t p = p0; p < p1; ++p)
            for (int64_t qb = 0; qb < nqb; ++qb)
                task(c, s, p / s.G, p % s.G, qb * s.Bq, std::min(s.n, (qb + 1) * s.Bq), wbase ? wbase + p * s.T : nullptr);
    };
    if (by_pair) {
        float* wbase = s.weights ? partial.data() : nullptr;
#pragma omp parallel num_threads(nt)
        pair_range(pairs * omp_get_thread_num() / omp_get_num_threads(), pairs * (omp_get_thread_num() + 1) / omp_get_num_threads(), wbase);
    } else {
#pragma omp parallel num_threads(nt)
        {
            const int t = omp_get_thread_num(), n = omp_get_num_threads();
            float* wbase = partial.data() + size_t(t) * size_t(pairs * s.T);
            for (int64_t tk = tasks * t / n; tk < tasks * (t + 1) / n; ++tk) {
                const int64_t p = tk / nqb, qb = tk % nqb;
                task(c, s, p / s.G, p % s.G, qb * s.Bq, std::min(s.n, (qb + 1) * s.Bq), wbase + p * s.T);
            }
        }
        for (int t = 1; t < nt; ++t)
            for (int64_t e = 0; e < pairs * s.T; ++e) partial[size_t(e)] += partial[size_t(t) * size_t(pairs * s.T) + size_t(e)];
    }
    if (s.weights)
        for (int64_t p = 0; p < pairs; ++p)
            store_row(c.dst2.bytes() + (p / s.G) * c.dst2.nb[0] + (p % s.G) * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, s.T,
                      partial.data() + p * s.T);
}
}  // namespace v1

// =========================================================================================
// harness: plain host buffers described by TensorViews
// =========================================================================================
struct Buf {
    std::vector<char> mem;
    TensorView v;
    Buf(std::initializer_list<int64_t> shape, DType dt) {
        v.dtype = dt;
        v.ndim = int(shape.size());
        int i = 0;
        for (int64_t d : shape) v.ne[i++] = d;
        int64_t st = dtype_size(dt);
        for (int k = v.ndim - 1; k >= 0; --k) {
            v.nb[k] = st;
            st *= v.ne[k];
        }
        mem.assign(size_t(st) + 64, 0);
        v.data = mem.data();
    }
    void fill_uniform(std::mt19937_64& rng, double lo, double hi) {
        std::uniform_real_distribution<double> u(lo, hi);
        for (int64_t i = 0; i < v.numel(); ++i) {
            if (v.dtype == DType::F32) reinterpret_cast<float*>(v.data)[i] = float(u(rng));
            else reinterpret_cast<double*>(v.data)[i] = u(rng);
        }
    }
    std::vector<double> values() const {
        std::vector<double> r((size_t)v.numel());
        for (int64_t i = 0; i < v.numel(); ++i)
            r[size_t(i)] = v.dtype == DType::F32 ? reinterpret_cast<const float*>(v.data)[i] : reinterpret_cast<const double*>(v.data)[i];
        return r;
    }
};

struct Problem {
    const char* name;
    int64_t B, NH, G, n, T, HS;
    bool cache;  // true: T slots of older scattered positions + the n new ones; false: prefill
};

struct Inputs {
    Buf q, k, v, kpos, qpos, dy;
    double visible_pairs = 0;  // (query, slot) pairs that attend, per head
    Inputs(const Problem& p, DType dt, uint64_t seed)
        : q({p.B, p.NH, p.n, p.HS}, dt), k({p.B, p.G, p.T, p.HS}, dt), v({p.B, p.G, p.T, p.HS}, dt), kpos({1, 1, p.T}, DType::I32),
          qpos({1, p.n}, DType::I32), dy({p.B, p.NH, p.n, p.HS}, dt) {
        std::mt19937_64 rng(seed);
        q.fill_uniform(rng, -2, 2), k.fill_uniform(rng, -2, 2), v.fill_uniform(rng, -1, 1), dy.fill_uniform(rng, -1, 1);
        const int64_t P = p.cache ? 3 * p.T : p.T - p.n;
        std::vector<int32_t> kp;
        if (p.cache) {  // T - n survivors of older positions, then the chunk, shuffled over slots
            std::vector<int32_t> old((size_t)P);
            std::iota(old.begin(), old.end(), 0);
            std::shuffle(old.begin(), old.end(), rng);
            kp.assign(old.begin(), old.begin() + (p.T - p.n));
            for (int64_t i = 0; i < p.n; ++i) kp.push_back(int32_t(P + i));
            std::shuffle(kp.begin(), kp.end(), rng);
        } else {
            for (int64_t j = 0; j < p.T; ++j) kp.push_back(int32_t(j));
        }
        std::memcpy(kpos.v.data, kp.data(), kp.size() * 4);
        for (int64_t i = 0; i < p.n; ++i) {
            reinterpret_cast<int32_t*>(qpos.v.data)[i] = int32_t(P + i);
            for (int32_t x : kp) visible_pairs += x <= P + i;
        }
    }
};

OpCall sdpa_call(Inputs& in, const Problem& p, Buf& y, Buf* w) {
    OpCall c;
    c.op = OpKind::SDPA;
    c.p.alpha = 1.0f / std::sqrt(float(p.HS));
    c.dst = y.v;
    if (w) c.dst2 = w->v;
    for (TensorView t : {in.q.v, in.k.v, in.v.v, in.kpos.v, in.qpos.v}) c.src[c.nsrc++] = t;
    return c;
}

double max_rel_err(const Buf& got, const Buf& ref) {
    std::vector<double> g = got.values(), r = ref.values();
    double e = 0, s = 0;
    for (size_t i = 0; i < g.size(); ++i) e = std::max(e, std::fabs(g[i] - r[i])), s = std::max(s, std::fabs(r[i]));
    return s > 0 ? e / s : e;
}

using Runner = std::function<void(const OpCall&)>;

// Median over `reps` samples of the wall time per call, seconds. Each sample repeats the call
// until 50 ms have passed: this machine's clock ticks in 4 ms steps.
double time_it(const std::function<void()>& fn, int reps) {
    fn();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
        auto a = std::chrono::steady_clock::now();
        int calls = 0;
        double el = 0;
        do {
            fn();
            ++calls;
            el = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
        } while (el < 0.05);
        t.push_back(el / calls);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main_impl(int argc, char** argv) {
    const LabArgs args = parse_lab_args(argc, argv, "kvlab_lab_sdpa");
    if (!args.ok) return 2;
    const bool quick = args.quick;
    const int threads = args.threads;
    OpContext ctx;
    ctx.threads = threads;
    KernelBackend* product = lab_backend();
    if (!product) return 2;
    KernelBackend& be = *product;
    struct Version {
        const char* name;
        Runner run;
    };
    std::vector<Version> versions = {{"v1", [&](const OpCall& c) { v1::run(c, threads); }},
                                     {"v2", [&](const OpCall& c) { be.compute(ctx, c); }}};

    // ---- correctness against the f64 reference ----------------------------------------
    const Problem checks[] = {{"check_prefill", 1, 6, 2, 150, 150, 64, false}, {"check_cache", 2, 4, 2, 40, 300, 72, true}};
    bool ok = true;
    for (const Problem& p : checks) {
        Inputs in(p, DType::F64, 7);
        Buf yref({p.B, p.NH, p.n, p.HS}, DType::F64), wref({p.B, p.G, p.T}, DType::F64);
        OpCall rc = sdpa_call(in, p, yref, &wref);
        kv::ref::compute(rc);
        Inputs in32(p, DType::F32, 7);
        for (const Version& ver : versions) {
            Buf y({p.B, p.NH, p.n, p.HS}, DType::F32), w({p.B, p.G, p.T}, DType::F32);
            ver.run(sdpa_call(in32, p, y, &w));
            const double ey = max_rel_err(y, yref), ew = max_rel_err(w, wref);
            const bool pass = ey < 1e-4 && ew < 1e-4;
            ok = ok && pass;
            std::printf("%-14s %s  y err %.2e  weights err %.2e  %s\n", p.name, ver.name, ey, ew, pass ? "ok" : "FAIL");
        }
    }
    if (!ok) return 1;

    // ---- speed ---------------------------------------------------------------------------
    std::vector<Problem> shapes = {{"qwen2.5-0.5b cache4096 chunk512", 1, 14, 2, 512, 4096, 64, true},
                                   {"smollm2-135m prefill1024", 1, 9, 3, 1024, 1024, 64, false},
                                   {"qwen2.5-0.5b decode cache4096", 1, 14, 2, 1, 4096, 64, true}};
    if (quick) shapes = {{"qwen2.5-0.5b cache1024 chunk128", 1, 14, 2, 128, 1024, 64, true}};
    const int reps = quick ? 3 : 5;
    std::printf("\nthreads %d; GFLOP/s counts 4 * HS flops per visible (query, slot) pair per head\n", threads);
    for (const Problem& p : shapes) {
        Inputs in(p, DType::F32, 11);
        const double gflop = 4.0 * double(p.B * p.NH) * in.visible_pairs * double(p.HS) * 1e-9;
        std::printf("\n%s (B %lld, NH %lld, G %lld, n %lld, T %lld, HS %lld): %.2f GFLOP\n", p.name, (long long)p.B, (long long)p.NH,
                    (long long)p.G, (long long)p.n, (long long)p.T, (long long)p.HS, gflop);
        for (const Version& ver : versions) {
            Buf y({p.B, p.NH, p.n, p.HS}, DType::F32), w({p.B, p.G, p.T}, DType::F32);
            OpCall plain = sdpa_call(in, p, y, nullptr), with_w = sdpa_call(in, p, y, &w);
            // Samples alternate between the two calls so both see the same machine load.
            std::vector<double> s0, s1;
            for (int r = 0; r < reps; ++r) {
                s0.push_back(time_it([&] { ver.run(plain); }, 1));
                s1.push_back(time_it([&] { ver.run(with_w); }, 1));
            }
            std::sort(s0.begin(), s0.end());
            std::sort(s1.begin(), s1.end());
            const double t0 = s0[s0.size() / 2], t1 = s1[s1.size() / 2];
            std::printf("  %s forward   no weights %8.2f ms %6.1f GFLOP/s | weights %8.2f ms %6.1f GFLOP/s | ratio %.2f\n", ver.name,
                        t0 * 1e3, gflop / t0, t1 * 1e3, gflop / t1, t1 / t0);
        }
        // Backward (v2): 5 products of the same size as the forward's 2 -> 2.5x the flops.
        Buf dq({p.B, p.NH, p.n, p.HS}, DType::F32), dk({p.B, p.G, p.T, p.HS}, DType::F32), dv({p.B, p.G, p.T, p.HS}, DType::F32);
        OpCall bc;
        bc.op = OpKind::SDPA_BACKWARD;
        bc.p.alpha = 1.0f / std::sqrt(float(p.HS));
        bc.dst = dq.v, bc.dst2 = dk.v, bc.dst3 = dv.v;
        for (TensorView t : {in.q.v, in.k.v, in.v.v, in.kpos.v, in.qpos.v, in.dy.v}) bc.src[bc.nsrc++] = t;
        const double tb = time_it([&] { be.compute(ctx, bc); }, reps);
        std::printf("  v2 backward %8.2f ms %6.1f GFLOP/s\n", tb * 1e3, 2.5 * gflop / tb);
    }
    return 0;
}

}  // namespace kv::lab

int main(int argc, char** argv) { return kv::lab::main_impl(argc, argv); }
