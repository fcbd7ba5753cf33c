// SDPA on the CPU, forward and backward (v2 of kernels/lab/sdpa_lab.cpp). A task is one
// (batch, KV group, query block) for all R heads of the group, so GQA heads share every K/V
// load. Each thread converts the K/V of a (b, g) pair once into padded f32 (f64) panels and
// reuses them for all its tasks of that pair; products run through the register-blocked tiles
// of gemm_tile.h; key blocks no query of a task can see are skipped. Results depend on the
// thread count only through the order of the weight and dk/dv partial sums.
// Decode (n <= 4 queries) takes its own path: no K^T copy (converting all of K per call cost
// more than the products), scores as dot products on K in place and P.V through gemv_tile.h,
// keys split into fixed ranges so both threads share even one (b, g) pair.
//
// Index
//   [SECTION] shapes, block visibility, task partition
//   [SECTION] per-pair K/V conversion
//   [SECTION] forward: online softmax, attention-weight sums
//   [SECTION] forward, decode: key ranges in place, merged partial softmax
//   [SECTION] backward: blockwise recompute of dq, dk, dv
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "gemm_tile.h"
#include "gemv_tile.h"
#include "unit_pool.h"
#include "kernels/common/element_math.h"
#include "kernels/common/online_softmax.h"

namespace kv::cpu {

namespace {

// =========================================================================================
// [SECTION] shapes, block visibility, task partition
// =========================================================================================
constexpr int64_t kKeyBlock = 128;                      // keys per block (a multiple of 16)
constexpr int64_t kMaxQueryBlock = 32;                  // queries per task
constexpr int64_t kWeightBudget = int64_t(1) << 22;     // forward with weights: kept probabilities per thread (elements)
constexpr int64_t kDefaultTempBytes = int64_t(64) << 20;  // backward: SDPA_BACKWARD's default bound

inline int64_t round16(int64_t x) { return (x + 15) / 16 * 16; }
inline int32_t read_i32(const TensorView& v, int64_t off) { return *reinterpret_cast<const int32_t*>(v.bytes() + off); }

template <class A>
struct SdpaShape {
    int64_t B, NH, n, HS, G, T, R;
    int64_t HSP;  // HS padded to a multiple of 16 (vector columns)
    int64_t Tp;   // T padded to a multiple of 16
    int64_t nkb;  // key blocks
    int64_t Bq, nqb, pairs, tasks;
    A alpha;
    int window;
    A cap;  // soft-capping of the scores (0 = none)
    std::vector<A> sinks;  // per query head: a sink logit in every denominator (gpt-oss); empty = none
};

template <class A>
SdpaShape<A> sdpa_shape(const OpCall& c) {
    const TensorView &q = c.src[0], &k = c.src[1];
    SdpaShape<A> s;
    s.B = q.ne[0], s.NH = q.ne[1], s.n = q.ne[2], s.HS = q.ne[3], s.G = k.ne[1], s.T = k.ne[2];
    s.R = s.NH / s.G;
    s.HSP = round16(s.HS);
    s.Tp = round16(s.T);
    s.nkb = (s.T + kKeyBlock - 1) / kKeyBlock;
    s.alpha = A(c.p.alpha);
    s.window = c.p.window;
    s.cap = A(c.p.softcap);
    // The sink source: SDPA's src5, SDPA_BACKWARD's src6 (after dy).
    const int sink_src = c.op == OpKind::SDPA_BACKWARD ? 6 : 5;
    if (has_src(c, sink_src)) {
        s.sinks.resize(size_t(s.NH));
        load_row(c.src[sink_src].bytes(), c.src[sink_src].nb[0], c.src[sink_src].dtype, s.NH, s.sinks.data());
    }
    s.pairs = s.B * s.G;
    s.Bq = kMaxQueryBlock;
    return s;
}

template <class A>
void set_query_block(SdpaShape<A>& s, int64_t bq) {
    s.Bq = std::max<int64_t>(1, std::min({bq, kMaxQueryBlock, std::max<int64_t>(s.n, 1)}));
    s.nqb = (s.n + s.Bq - 1) / s.Bq;
    s.tasks = s.pairs * s.nqb;
}

// Position ranges of every key block of every kpos row, and of every query block: enough to
// decide per (task, key block) whether any query sees a key (else skip) and whether all of
// them see all keys (then no mask is needed).
struct Visibility {
    int64_t kp_rows_b, kp_rows_g;      // kpos broadcast sizes (1 or B, 1 or G)
    std::vector<int32_t> klo, khi;     // [kp_row * nkb + kb]
    std::vector<int32_t> qlo, qhi;     // [qp_row * nqb + qb]
    int64_t qp_rows;
    int window = 0;

    int64_t kp_row(int64_t b, int64_t g) const { return (kp_rows_b == 1 ? 0 : b) * kp_rows_g + (kp_rows_g == 1 ? 0 : g); }
    int64_t qp_row(int64_t b) const { return qp_rows == 1 ? 0 : b; }
    // 0: nobody sees the block; 1: some entries masked; 2: every query sees every key.
    int state(int64_t kr, int64_t kb, int64_t nkb, int64_t qr, int64_t qb, int64_t nqb) const {
        const int32_t kl = klo[size_t(kr * nkb + kb)], kh = khi[size_t(kr * nkb + kb)];
        const int32_t ql = qlo[size_t(qr * nqb + qb)], qh = qhi[size_t(qr * nqb + qb)];
        if (kl > qh) return 0;
        if (window > 0 && int64_t(kh) <= int64_t(ql) - window) return 0;
        const bool all = kh <= ql && (window <= 0 || int64_t(kl) > int64_t(qh) - window);
        return all ? 2 : 1;
    }
};

template <class A>
Visibility visibility(const OpCall& c, const SdpaShape<A>& s) {
    const TensorView &kpos = c.src[3], &qpos = c.src[4];
    Visibility v;
    v.window = s.window;
    v.kp_rows_b = kpos.ne[0];
    v.kp_rows_g = kpos.ne[1];
    const int64_t krows = v.kp_rows_b * v.kp_rows_g;
    v.klo.assign(size_t(krows * s.nkb), INT32_MAX);
    v.khi.assign(size_t(krows * s.nkb), INT32_MIN);
    for (int64_t r = 0; r < krows; ++r) {
        const int64_t bb = r / v.kp_rows_g, gg = r % v.kp_rows_g;
        for (int64_t j = 0; j < s.T; ++j) {
            const int32_t p = read_i32(kpos, bb * kpos.nb[0] + gg * kpos.nb[1] + j * kpos.nb[2]);
            const size_t at = size_t(r * s.nkb + j / kKeyBlock);
            v.klo[at] = std::min(v.klo[at], p);
            v.khi[at] = std::max(v.khi[at], p);
        }
    }
    v.qp_rows = qpos.ne[0];
    v.qlo.assign(size_t(v.qp_rows * s.nqb), INT32_MAX);
    v.qhi.assign(size_t(v.qp_rows * s.nqb), INT32_MIN);
    for (int64_t r = 0; r < v.qp_rows; ++r)
        for (int64_t i = 0; i < s.n; ++i) {
            const int32_t p = read_i32(qpos, r * qpos.nb[0] + i * qpos.nb[1]);
            const size_t at = size_t(r * s.nqb + i / s.Bq);
            v.qlo[at] = std::min(v.qlo[at], p);
            v.qhi[at] = std::max(v.qhi[at], p);
        }
    return v;
}

// Contiguous task ranges per thread with about equal work (visible key blocks x rows), so
// causal prefill, where late query blocks see many more keys, still splits evenly. Static,
// so results depend only on the thread count.
template <class A>
std::vector<int64_t> partition_tasks(const SdpaShape<A>& s, const Visibility& vis, int nt) {
    std::vector<double> cum((size_t)s.tasks + 1, 0.0);
    for (int64_t t = 0; t < s.tasks; ++t) {
        const int64_t p = t / s.nqb, qb = t % s.nqb, b = p / s.G, g = p % s.G;
        int64_t vis_blocks = 0;
        for (int64_t kb = 0; kb < s.nkb; ++kb) vis_blocks += vis.state(vis.kp_row(b, g), kb, s.nkb, vis.qp_row(b), qb, s.nqb) != 0;
        const int64_t nq = std::min(s.Bq, s.n - qb * s.Bq);
        cum[size_t(t + 1)] = cum[size_t(t)] + double(nq) * double(vis_blocks + 1);
    }
    std::vector<int64_t> begin((size_t)nt + 1, s.tasks);
    begin[0] = 0;
    int64_t t = 0;
    for (int k = 1; k < nt; ++k) {
        const double target = cum.back() * k / nt;
        while (t < s.tasks && cum[size_t(t + 1)] <= target) ++t;
        begin[size_t(k)] = std::max(t, begin[size_t(k - 1)]);
    }
    return begin;
}

// Run fn(t) for t in [0, nt) on up to nt threads of the unit pool (every t runs once, on
// whichever thread claims it; each t's buffers are its own).
template <class F>
void run_ranges(int nt, F&& fn) {
    run_units(nt, nt, [&](int64_t t) { fn(int(t)); });
}

// =========================================================================================
// [SECTION] per-pair K/V conversion
// =========================================================================================
// One (b, g) pair's keys/values in the layouts the tiles read. Transposed copies are always
// converted, as one (HS, kKeyBlock) panel per key block (panel kb at kt + kb * HS * kKeyBlock,
// zero padded): a (HS, T) layout would put the rows a tile walks 4*T bytes apart, which on
// this cache maps them to the same sets (the lab measured 2-3x slower products). Natural
// layouts point into the tensor itself when it already is A with unit last stride and HS a
// multiple of 16, else into a padded copy.
template <class A>
struct PairKV {
    const A* kt = nullptr;  // nkb panels (HS, kKeyBlock)  K^T
    const A* vt = nullptr;  // nkb panels (HS, kKeyBlock)  V^T   (backward)
    const A* kn = nullptr;  // (T, ldkn) K            (backward)
    const A* vn = nullptr;  // (T, ldvn) V            (forward)
    int64_t ldkn = 0, ldvn = 0;
    const A* kp = nullptr;  // (Tp) slot positions as A (exact below 2^24)
};

enum PairNeeds { NEED_KT = 1, NEED_VT = 2, NEED_KN = 4, NEED_VN = 8 };

// Elements of per-thread storage convert_pair may use for `needs`.
template <class A>
int64_t pair_storage(const SdpaShape<A>& s, int needs) {
    int64_t e = s.Tp;  // positions
    if (needs & NEED_KT) e += s.HS * s.nkb * kKeyBlock;
    if (needs & NEED_VT) e += s.HS * s.nkb * kKeyBlock;
    if (needs & NEED_KN) e += s.Tp * s.HSP;
    if (needs & NEED_VN) e += s.Tp * s.HSP;
    return e;
}

template <class A>
void transpose_into(const TensorView& x, const char* base, const SdpaShape<A>& s, A* out) {
    std::fill(out, out + s.HS * s.nkb * kKeyBlock, A(0));
    for (int64_t j = 0; j < s.T; ++j) {
        const A* row = row_in<A>(x, base + j * x.nb[2] - x.bytes(), s.HS, 5);
        A* panel = out + (j / kKeyBlock) * s.HS * kKeyBlock + j % kKeyBlock;
        for (int64_t d = 0; d < s.HS; ++d) panel[d * kKeyBlock] = row[d];
    }
}

template <class A>
const A* natural_into(const TensorView& x, const char* base, const SdpaShape<A>& s, A* out, int64_t* ld) {
    const bool native = (sizeof(A) == 4 ? x.dtype == DType::F32 : x.dtype == DType::F64) && x.nb[3] == int64_t(sizeof(A)) &&
                        x.nb[2] % int64_t(sizeof(A)) == 0 && s.HS == s.HSP;
    if (native) {
        *ld = x.nb[2] / int64_t(sizeof(A));
        return reinterpret_cast<const A*>(base);
    }
    for (int64_t j = 0; j < s.T; ++j) {
        load_row(base + j * x.nb[2], x.nb[3], x.dtype, s.HS, out + j * s.HSP);
        for (int64_t d = s.HS; d < s.HSP; ++d) out[j * s.HSP + d] = A(0);
    }
    *ld = s.HSP;
    return out;
}

template <class A>
PairKV<A> convert_pair(const OpCall& c, const SdpaShape<A>& s, int64_t b, int64_t g, int needs, A* store) {
    const TensorView &k = c.src[1], &v = c.src[2], &kpos = c.src[3];
    const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
    const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
    PairKV<A> kv;
    A* kp = store;
    store += s.Tp;
    const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g;
    for (int64_t j = 0; j < s.T; ++j) kp[j] = A(read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + j * kpos.nb[2]));
    for (int64_t j = s.T; j < s.Tp; ++j) kp[j] = std::numeric_limits<A>::infinity();  // never visible
    kv.kp = kp;
    if (needs & NEED_KT) {
        transpose_into(k, kbase, s, store);
        kv.kt = store;
        store += s.HS * s.nkb * kKeyBlock;
    }
    if (needs & NEED_VT) {
        transpose_into(v, vbase, s, store);
        kv.vt = store;
        store += s.HS * s.nkb * kKeyBlock;
    }
    if (needs & NEED_KN) {
        kv.kn = natural_into(k, kbase, s, store, &kv.ldkn);
        store += s.Tp * s.HSP;
    }
    if (needs & NEED_VN) kv.vn = natural_into(v, vbase, s, store, &kv.ldvn);
    return kv;
}

// Mask one score row of a key block: entries query position `qp` cannot see become -inf.
template <class A>
inline void mask_row(A* sr, const A* kp, int64_t nk, A qp, int window) {
    const A lo = window > 0 ? qp - A(window) : -std::numeric_limits<A>::infinity();
    const A neg_inf = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < nk; ++j) sr[j] = (kp[j] <= qp && kp[j] > lo) ? sr[j] : neg_inf;
}

// Soft-capping of one score row: s -> cap tanh(s / cap); with dfac, also its derivative
// 1 - tanh^2 per entry (the backward's factor on dS).
// f32 tanh is kv_tanh's rational interpolant, inlined so the row vectorizes (std::tanh per
// score cost Gemma 2 half its prefill speed; 1 - 2 / (exp(2x) + 1) twice the work of the
// interpolant and no relative accuracy near 0); f64 is std::tanh.
template <class A>
inline void cap_row(A* sr, int64_t nk, A cap, A* dfac = nullptr) {
    const A inv_cap = A(1) / cap;
#pragma omp simd
    for (int64_t j = 0; j < nk; ++j) sr[j] = cap * kv_tanh(sr[j] * inv_cap);
    if (dfac)
        for (int64_t j = 0; j < nk; ++j) dfac[j] = A(1) - (sr[j] / cap) * (sr[j] / cap);
}

template <class A>
inline A row_max(const A* x, int64_t n) {
    A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    return m;
}

// Load the task's queries scaled by alpha into rows r * nq + i (ld HSP, zero padded).
template <class A>
void load_queries(const TensorView& q, const SdpaShape<A>& s, int64_t b, int64_t g, int64_t i0, int64_t nq, A* qs) {
    for (int64_t r = 0; r < s.R; ++r)
        for (int64_t i = 0; i < nq; ++i) {
            A* qr = qs + (r * nq + i) * s.HSP;
            load_row(q.bytes() + b * q.nb[0] + (g * s.R + r) * q.nb[1] + (i0 + i) * q.nb[2], q.nb[3], q.dtype, s.HS, qr);
            for (int64_t d = 0; d < s.HS; ++d) qr[d] *= s.alpha;
            for (int64_t d = s.HS; d < s.HSP; ++d) qr[d] = A(0);
        }
}

// =========================================================================================
// [SECTION] forward: online softmax, attention-weight sums
// =========================================================================================
// SDPA's optional dst3: one query row's log-sum-exp of its scaled scores, m + log l of the
// online softmax, formed in f64 (fidelity merges two attentions by it); -inf when the row sees
// nothing.
template <class A>
inline void store_lse(const TensorView& o, int64_t b, int64_t h, int64_t i, A m, A l) {
    const double x = l > A(0) ? double(m) + std::log(double(l)) : -std::numeric_limits<double>::infinity();
    char* p = o.bytes() + b * o.nb[0] + h * o.nb[1] + i * o.nb[2];
    if (o.dtype == DType::F64) *reinterpret_cast<double*>(p) = x;
    else *reinterpret_cast<float*>(p) = float(x);
}

// Per-thread buffers of the forward (elements of A).
template <class A>
struct FwdBufs {
    A *qs, *acc, *m, *l, *sc, *kept, *mblk;
    static int64_t size(const SdpaShape<A>& s, bool weights) {
        const int64_t rows = s.R * s.Bq;
        int64_t e = rows * s.HSP * 2 + rows * 2;
        e += weights ? s.nkb * rows * kKeyBlock + rows * s.nkb : rows * kKeyBlock;
        return e;
    }
    void carve(const SdpaShape<A>& s, bool weights, A* p) {
        const int64_t rows = s.R * s.Bq;
        qs = p, p += rows * s.HSP;
        acc = p, p += rows * s.HSP;
        m = p, p += rows;
        l = p, p += rows;
        if (weights) {
            kept = p, p += s.nkb * rows * kKeyBlock;
            mblk = p;
            sc = nullptr;
        } else {
            sc = p;
            kept = mblk = nullptr;
        }
    }
};

// One task: queries [i0, i0 + nq) of pair (b, g). With weights, the probabilities of each
// visited block stay in `kept` (one (rows, kKeyBlock) panel per key block, used in place of the
// score block) with the running max used for them, so the weight pass is one multiply-add per
// entry: exp(s - m_blk) * exp(m_blk - m) / l / R.
template <class A>
void fwd_task(const OpCall& c, const SdpaShape<A>& s, const Visibility& vis, const PairKV<A>& kv, int64_t b, int64_t g,
              int64_t qb, FwdBufs<A>& tb, A* w_out, std::vector<char>& visited) {
    const TensorView& y = c.dst;
    const int64_t i0 = qb * s.Bq, nq = std::min(s.Bq, s.n - i0), rows = s.R * nq, HSP = s.HSP;
    const A neg_inf = -std::numeric_limits<A>::infinity();
    const bool weights = w_out != nullptr;
    const TensorView& qpos = c.src[4];
    const int64_t qpb = qpos.ne[0] == 1 ? 0 : b;
    A qp[kMaxQueryBlock];
    for (int64_t i = 0; i < nq; ++i) qp[i] = A(read_i32(qpos, qpb * qpos.nb[0] + (i0 + i) * qpos.nb[1]));

    load_queries(c.src[0], s, b, g, i0, nq, tb.qs);
    std::fill(tb.acc, tb.acc + rows * HSP, A(0));
    std::fill(tb.m, tb.m + rows, neg_inf);
    std::fill(tb.l, tb.l + rows, A(0));
    const int64_t kr = vis.kp_row(b, g), qr = vis.qp_row(b);
    const int64_t ldsc = kKeyBlock;
    for (int64_t kb = 0; kb < s.nkb; ++kb) {
        const int st = vis.state(kr, kb, s.nkb, qr, qb, s.nqb);
        visited[size_t(kb)] = st != 0;
        if (st == 0) continue;
        const int64_t j0 = kb * kKeyBlock, nk = std::min(kKeyBlock, s.T - j0), nkp = round16(nk);
        A* sc = weights ? tb.kept + kb * rows * kKeyBlock : tb.sc;
        gemm_bcast(rows, nkp, s.HS, tb.qs, HSP, 1, kv.kt + kb * s.HS * kKeyBlock, kKeyBlock, sc, ldsc, false);  // S = (alpha q) K^T
        for (int64_t row = 0; row < rows; ++row) {
            A* sr = sc + row * ldsc;
            if (s.cap > A(0)) cap_row(sr, nk, s.cap);
            if (st == 1) mask_row(sr, kv.kp + j0, nk, qp[row % nq], s.window);
            const A mb = row_max(sr, nk);
            if (mb == neg_inf) {  // this row sees nothing here: zero probabilities, state unchanged
                std::fill(sr, sr + nkp, A(0));
                if (weights) tb.mblk[row * s.nkb + kb] = A(0);
                continue;
            }
            const A m_old = tb.m[row], m_new = std::max(m_old, mb);
            const A corr = online_softmax_scale(m_old, m_new);
            A lsum = 0;
#pragma omp simd reduction(+ : lsum)
            for (int64_t j = 0; j < nk; ++j) {
                sr[j] = kv_exp(sr[j] - m_new);
                lsum += sr[j];
            }
            for (int64_t j = nk; j < nkp; ++j) sr[j] = A(0);
            tb.l[row] = tb.l[row] * corr + lsum;
            tb.m[row] = m_new;
            if (corr != A(1)) {
                A* ar = tb.acc + row * HSP;
                for (int64_t d = 0; d < HSP; ++d) ar[d] *= corr;
            }
            if (weights) tb.mblk[row * s.nkb + kb] = m_new;
        }
        gemm_bcast(rows, HSP, nk, sc, ldsc, 1, kv.vn + j0 * kv.ldvn, kv.ldvn, tb.acc, HSP, true);  // acc += P V
    }
    for (int64_t r = 0; r < s.R; ++r)
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t row = r * nq + i;
            A* ar = tb.acc + row * HSP;
            const A f = s.sinks.empty() ? A(1) : online_softmax_sink(tb.m[row], tb.l[row], s.sinks[size_t(g * s.R + r)]);
            const A inv = tb.l[row] > A(0) ? f / tb.l[row] : A(0);
            for (int64_t d = 0; d < s.HS; ++d) ar[d] *= inv;
            store_row(y.bytes() + b * y.nb[0] + (g * s.R + r) * y.nb[1] + (i0 + i) * y.nb[2], y.nb[3], y.dtype, s.HS, ar);
            if (c.dst3.data) store_lse(c.dst3, b, g * s.R + r, i0 + i, tb.m[row], tb.l[row]);
        }
    if (!weights) return;
    const A inv_r = A(1) / A(s.R);
    for (int64_t row = 0; row < rows; ++row) {
        if (!(tb.l[row] > A(0))) continue;
        const A f0 = inv_r / tb.l[row], mrow = tb.m[row];
        for (int64_t kb = 0; kb < s.nkb; ++kb) {
            if (!visited[size_t(kb)]) continue;
            const int64_t j0 = kb * kKeyBlock, nk = std::min(kKeyBlock, s.T - j0);
            const A* kr_row = tb.kept + (kb * rows + row) * kKeyBlock;
            const A f = kv_exp(tb.mblk[row * s.nkb + kb] - mrow) * f0;
#pragma omp simd
            for (int64_t j = 0; j < nk; ++j) w_out[j0 + j] += f * kr_row[j];
        }
    }
}

template <class A>
void sdpa_forward_run(const OpContext& ctx, const OpCall& c) {
    SdpaShape<A> s = sdpa_shape<A>(c);
    const bool weights = c.dst2.data != nullptr;
    int64_t bq = kMaxQueryBlock;
    if (weights && s.T > 0) bq = kWeightBudget / (s.R * s.nkb * kKeyBlock);
    set_query_block(s, bq);
    if (weights) {  // weight sums start at zero (also when no task runs)
        std::vector<A> z((size_t)s.T, A(0));
        for (int64_t p = 0; p < s.pairs; ++p)
            store_row(c.dst2.bytes() + (p / s.G) * c.dst2.nb[0] + (p % s.G) * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, s.T, z.data());
    }
    if (s.tasks == 0) return;
    const Visibility vis = visibility(c, s);
    const int nt = int(std::min<int64_t>(std::max(1, kernel_threads(ctx)), s.tasks));
    const std::vector<int64_t> begin = partition_tasks(s, vis, nt);
    // Per-thread storage: task buffers, one converted pair, and weight partials for the pairs
    // of its task range (first..last pair).
    const int needs = NEED_KT | NEED_VN;
    const int64_t per_thread = FwdBufs<A>::size(s, weights) + pair_storage(s, needs);
    std::vector<int64_t> wofs((size_t)nt + 1, 0);
    for (int t = 0; t < nt; ++t) {
        const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
        const int64_t npairs = t1 > t0 ? (t1 - 1) / s.nqb - t0 / s.nqb + 1 : 0;
        wofs[size_t(t + 1)] = wofs[size_t(t)] + (weights ? npairs * s.T : 0);
    }
    KernelScratch mem(ctx, size_t(per_thread * nt + wofs[size_t(nt)]) * sizeof(A));
    A* wpart = mem.as<A>() + per_thread * nt;
    std::fill(wpart, wpart + wofs[size_t(nt)], A(0));

    auto run = [&](int t) {
        const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
        A* base = mem.as<A>() + per_thread * t;
        FwdBufs<A> tb;
        tb.carve(s, weights, base);
        A* pair_store = base + FwdBufs<A>::size(s, weights);
        std::vector<char> visited((size_t)s.nkb, 0);
        int64_t cur = -1;
        PairKV<A> kv;
        for (int64_t task = t0; task < t1; ++task) {
            const int64_t p = task / s.nqb, qb = task % s.nqb, b = p / s.G, g = p % s.G;
            if (p != cur) {
                kv = convert_pair(c, s, b, g, needs, pair_store);
                cur = p;
            }
            A* w = weights ? wpart + wofs[size_t(t)] + (p - t0 / s.nqb) * s.T : nullptr;
            fwd_task(c, s, vis, kv, b, g, qb, tb, w, visited);
        }
    };
    run_ranges(nt, run);
    if (!weights) return;
    // Sum the partials of each pair in thread order (deterministic for a thread count).
    std::vector<A> sum((size_t)s.T);
    for (int64_t p = 0; p < s.pairs; ++p) {
        std::fill(sum.begin(), sum.end(), A(0));
        bool any = false;
        for (int t = 0; t < nt; ++t) {
            const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
            if (t1 <= t0 || p < t0 / s.nqb || p > (t1 - 1) / s.nqb) continue;
            const A* src = wpart + wofs[size_t(t)] + (p - t0 / s.nqb) * s.T;
            for (int64_t j = 0; j < s.T; ++j) sum[size_t(j)] += src[j];
            any = true;
        }
        if (any)
            store_row(c.dst2.bytes() + (p / s.G) * c.dst2.nb[0] + (p % s.G) * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, s.T, sum.data());
    }
}

// =========================================================================================
// [SECTION] forward, decode: key ranges in place, merged partial softmax
// =========================================================================================
// For n <= kDecodeQueries the R * n query rows of a (b, g) pair are few, so the forward is
// bound by reading K and V once. A unit is (pair, range of up to kDecodeKeys keys): scores
// S = (alpha q) . k_j straight from K's rows (f32 or bf16), the range's own max m_u, sum l_u
// and acc_u = sum_j exp(S - m_u) v_j; the partials of a pair are merged in range order
// (m = max m_u, scale exp(m_u - m)), so results do not depend on the thread count. Units
// run through unit_pool.h. With weights, each unit keeps its probabilities and the sums are
// formed after the merge.
constexpr int64_t kDecodeQueries = 4;  // queries per call up to which decode runs
constexpr int64_t kDecodeKeys = 512;   // keys per unit
constexpr int64_t kDecodeParallelBytes = int64_t(256) << 10;  // K+V bytes below which one thread runs

bool decode_applies(const OpCall& c, const SdpaShape<float>& s) {
    const TensorView &k = c.src[1], &v = c.src[2];
    if (s.n < 1 || s.n > kDecodeQueries || s.HS % 16 != 0 || s.R < 1) return false;
    if (k.dtype != v.dtype || (k.dtype != DType::F32 && k.dtype != DType::BF16)) return false;
    const int64_t es = dtype_size(k.dtype);
    return k.nb[3] == es && v.nb[3] == es && k.nb[2] % es == 0 && v.nb[2] % es == 0 && k.nb[2] >= 0 && v.nb[2] >= 0;
}

template <class W>
void sdpa_decode(const OpContext& ctx, const OpCall& c, const SdpaShape<float>& s) {
    const TensorView &q = c.src[0], &k = c.src[1], &v = c.src[2], &kpos = c.src[3], &qpos = c.src[4], &y = c.dst;
    const bool weights = c.dst2.data != nullptr;
    const int64_t HS = s.HS, T = s.T, n = s.n, rows = s.R * n;
    // Ranges of equal length (at most kDecodeKeys): 600 keys as 300 + 300, not 512 + 88, so
    // two threads finish a layer's three pairs together.
    const int64_t nsplit = (T + kDecodeKeys - 1) / kDecodeKeys, units = s.pairs * nsplit;
    const int64_t range = (T + nsplit - 1) / nsplit;
    const int64_t ldk = k.nb[2] / int64_t(sizeof(W)), ldv = v.nb[2] / int64_t(sizeof(W));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // Per unit: m (rows), l (rows), acc (rows, HS); with weights also P (rows, kDecodeKeys).
    const int64_t per_unit = rows * (2 + HS) + (weights ? rows * kDecodeKeys : 0);
    KernelScratch mem(ctx, size_t(std::max<int64_t>(1, units * per_unit)) * sizeof(float));

    auto run_unit = [&](int64_t u) {
        const int64_t p = u / nsplit, j0 = (u % nsplit) * range, nk = std::min(range, T - j0);
        const int64_t b = p / s.G, g = p % s.G;
        float* um = mem.as<float>() + u * per_unit;
        float* ul = um + rows;
        float* acc = ul + rows;
        float* sc = weights ? acc + rows * HS : scratch<float>(0, rows * kDecodeKeys);
        float* qs = scratch<float>(1, rows * HS);
        for (int64_t r = 0; r < s.R; ++r)
            for (int64_t i = 0; i < n; ++i) {
                float* qr = qs + (r * n + i) * HS;
                load_row(q.bytes() + b * q.nb[0] + (g * s.R + r) * q.nb[1] + i * q.nb[2], q.nb[3], q.dtype, HS, qr);
                for (int64_t d = 0; d < HS; ++d) qr[d] *= s.alpha;
            }
        const W* kb = reinterpret_cast<const W*>(k.bytes() + b * k.nb[0] + g * k.nb[1]) + j0 * ldk;
        const W* vb = reinterpret_cast<const W*>(v.bytes() + b * v.nb[0] + g * v.nb[1]) + j0 * ldv;
        for (int64_t r0 = 0; r0 < rows; r0 += 4)  // S = (alpha q) K^T, four query rows per pass over K
            gemv_dot<W>(int(std::min<int64_t>(4, rows - r0)), nk, HS, qs + r0 * HS, HS, kb, ldk, sc + r0 * kDecodeKeys, kDecodeKeys);
        if (s.cap > 0.0f)
            for (int64_t r = 0; r < rows; ++r) cap_row(sc + r * kDecodeKeys, nk, s.cap);
        // Mask by position, then the range's softmax partials.
        const int64_t kpb = kpos.ne[0] == 1 ? 0 : b, kpg = kpos.ne[1] == 1 ? 0 : g, qpb = qpos.ne[0] == 1 ? 0 : b;
        int32_t* kp = reinterpret_cast<int32_t*>(scratch<float>(2, nk));
        int64_t kmin = INT64_MAX, kmax = INT64_MIN;
        for (int64_t j = 0; j < nk; ++j) {
            kp[j] = read_i32(kpos, kpb * kpos.nb[0] + kpg * kpos.nb[1] + (j0 + j) * kpos.nb[2]);
            kmin = std::min<int64_t>(kmin, kp[j]);
            kmax = std::max<int64_t>(kmax, kp[j]);
        }
        for (int64_t i = 0; i < n; ++i) {
            const int64_t qp = read_i32(qpos, qpb * qpos.nb[0] + i * qpos.nb[1]);
            const int64_t lo = s.window > 0 ? qp - s.window : INT64_MIN;
            if (kmax <= qp && kmin > lo) continue;  // query i sees every key of the range
            for (int64_t r = 0; r < s.R; ++r) {
                float* sr = sc + (r * n + i) * kDecodeKeys;
                for (int64_t j = 0; j < nk; ++j)
                    if (!(kp[j] <= qp && kp[j] > lo)) sr[j] = neg_inf;
            }
        }
        for (int64_t row = 0; row < rows; ++row) {
            float* sr = sc + row * kDecodeKeys;
            const float mb = row_max(sr, nk);
            um[row] = mb;
            if (mb == neg_inf) {  // nothing visible in this range
                std::fill(sr, sr + nk, 0.0f);
                ul[row] = 0;
                continue;
            }
            float lsum = 0;
#pragma omp simd reduction(+ : lsum)
            for (int64_t j = 0; j < nk; ++j) {
                sr[j] = kv_exp(sr[j] - mb);
                lsum += sr[j];
            }
            ul[row] = lsum;
        }
        // acc = P V. With 16 vector registers (AVX2) a pass of 3-4 query rows keeps 2 vectors (16
        // of HS = 64 columns) per row in registers: four passes each read one 64-byte line of every
        // 256-byte V row, down the rows at that stride. One row per pass keeps all 8 vectors: each
        // pass reads whole rows in order (the later ones from L2). Same sums, same order.
        if (kW == 8 && HS == 8 * kW) {
            for (int64_t r = 0; r < rows; ++r) gemv_axpy_tile<W, 1, 8>(nk, sc + r * kDecodeKeys, kDecodeKeys, vb, ldv, acc + r * HS, HS);
        } else {
            for (int64_t r0 = 0; r0 < rows; r0 += 4)
                gemv_axpy<W>(int(std::min<int64_t>(4, rows - r0)), HS, nk, sc + r0 * kDecodeKeys, kDecodeKeys, vb, ldv, acc + r0 * HS, HS);
        }
    };
    const int64_t bytes = s.pairs * T * HS * 2 * int64_t(sizeof(W));
    const int nt = bytes >= kDecodeParallelBytes ? int(std::min<int64_t>(std::max(1, kernel_threads(ctx)), units)) : 1;
    run_units(nt, units, run_unit);

    // Merge the ranges of each pair in order; then y and, with weights, the weight sums.
    std::vector<float> out((size_t)HS), wsum(weights ? (size_t)T : 0), m((size_t)rows), inv_l((size_t)rows);
    for (int64_t p = 0; p < s.pairs; ++p) {
        const int64_t b = p / s.G, g = p % s.G;
        const float* base = mem.as<float>() + p * nsplit * per_unit;
        for (int64_t row = 0; row < rows; ++row) {
            float mx = neg_inf;
            for (int64_t sp = 0; sp < nsplit; ++sp) mx = std::max(mx, base[sp * per_unit + row]);
            float l = 0;
            std::fill(out.begin(), out.end(), 0.0f);
            const int64_t h = g * s.R + row / n;
            // A sink at or above every score becomes the max before the ranges merge under it.
            if (!s.sinks.empty()) mx = std::max(mx, s.sinks[size_t(h)]);
            if (mx != neg_inf)
                for (int64_t sp = 0; sp < nsplit; ++sp) {
                    const float* um = base + sp * per_unit;
                    if (um[row] == neg_inf) continue;
                    const float f = kv_exp(um[row] - mx);
                    l += um[rows + row] * f;
                    const float* acc = um + 2 * rows + row * HS;
                    for (int64_t d = 0; d < HS; ++d) out[size_t(d)] += f * acc[d];
                }
            if (!s.sinks.empty()) l += kv_exp(s.sinks[size_t(h)] - mx);
            const float il = l > 0.0f ? 1.0f / l : 0.0f;
            for (int64_t d = 0; d < HS; ++d) out[size_t(d)] *= il;
            m[size_t(row)] = mx;
            inv_l[size_t(row)] = il;
            const int64_t r = row / n, i = row % n;
            store_row(y.bytes() + b * y.nb[0] + (g * s.R + r) * y.nb[1] + i * y.nb[2], y.nb[3], y.dtype, HS, out.data());
            if (c.dst3.data) store_lse(c.dst3, b, g * s.R + r, i, mx, l);
        }
        if (!weights) continue;
        std::fill(wsum.begin(), wsum.end(), 0.0f);
        const float inv_r = 1.0f / float(s.R);
        for (int64_t sp = 0; sp < nsplit; ++sp) {
            const float* um = base + sp * per_unit;
            const float* P = um + rows * (2 + HS);
            const int64_t j0 = sp * range, nk = std::min(range, T - j0);
            for (int64_t row = 0; row < rows; ++row) {
                if (um[row] == neg_inf || inv_l[size_t(row)] == 0.0f) continue;
                const float f = kv_exp(um[row] - m[size_t(row)]) * inv_l[size_t(row)] * inv_r;
                const float* pr = P + row * kDecodeKeys;
#pragma omp simd
                for (int64_t j = 0; j < nk; ++j) wsum[size_t(j0 + j)] += f * pr[j];
            }
        }
        store_row(c.dst2.bytes() + b * c.dst2.nb[0] + g * c.dst2.nb[1], c.dst2.nb[2], c.dst2.dtype, T, wsum.data());
    }
}

// =========================================================================================
// [SECTION] backward: blockwise recompute of dq, dk, dv
// =========================================================================================
// Per task (R * nq rows): P = softmax(S) and dP = dy V^T for all visible key blocks, each
// block a (rows, kKeyBlock) panel, then per row D = sum P dP and dS = P (dP - D) in place of dP, then
// dv += P^T dy, dk += dS^T (alpha q), dq = alpha dS K block by block. dk/dv accumulate per
// thread over its pairs; the partials are summed in thread order at the end.
template <class A>
struct BwdBufs {
    A *qs, *dy, *dq, *P, *dP, *dcap;  // dcap: soft-capping's derivative per score (with a cap)
    static int64_t size(const SdpaShape<A>& s) {
        const int64_t rows = s.R * s.Bq;
        return rows * s.HSP * 3 + rows * s.nkb * kKeyBlock * (s.cap > A(0) ? 3 : 2);
    }
    void carve(const SdpaShape<A>& s, A* p) {
        const int64_t rows = s.R * s.Bq;
        qs = p, p += rows * s.HSP;
        dy = p, p += rows * s.HSP;
        dq = p, p += rows * s.HSP;
        P = p, p += rows * s.nkb * kKeyBlock;
        dP = p, p += rows * s.nkb * kKeyBlock;
        dcap = s.cap > A(0) ? p : nullptr;
    }
};

// With sinks, dsink (NH) receives the task's -A_sink D per row (D = sum_j P dP, the row's
// dS offset: the sink has no value, so its dP is 0 and its dS is A_sink (0 - D)).
template <class A>
void bwd_task(const OpCall& c, const SdpaShape<A>& s, const Visibility& vis, const PairKV<A>& kv, int64_t b, int64_t g,
              int64_t qb, BwdBufs<A>& tb, A* dk, A* dv, A* dsink, std::vector<signed char>& state) {
    const int64_t i0 = qb * s.Bq, nq = std::min(s.Bq, s.n - i0), rows = s.R * nq, HSP = s.HSP;
    constexpr int64_t KB = kKeyBlock;
    const A neg_inf = -std::numeric_limits<A>::infinity();
    const TensorView &qpos = c.src[4], &gy = c.src[5];
    const int64_t qpb = qpos.ne[0] == 1 ? 0 : b;
    A qp[kMaxQueryBlock];
    for (int64_t i = 0; i < nq; ++i) qp[i] = A(read_i32(qpos, qpb * qpos.nb[0] + (i0 + i) * qpos.nb[1]));
    load_queries(c.src[0], s, b, g, i0, nq, tb.qs);
    for (int64_t r = 0; r < s.R; ++r)
        for (int64_t i = 0; i < nq; ++i) {
            A* dr = tb.dy + (r * nq + i) * HSP;
            load_row(gy.bytes() + b * gy.nb[0] + (g * s.R + r) * gy.nb[1] + (i0 + i) * gy.nb[2], gy.nb[3], gy.dtype, s.HS, dr);
            for (int64_t d = s.HS; d < HSP; ++d) dr[d] = A(0);
        }
    // Panel kb of P / dP: (rows, KB) at kb * rows * KB.
    auto Pp = [&](int64_t kb) { return tb.P + kb * rows * KB; };
    auto dPp = [&](int64_t kb) { return tb.dP + kb * rows * KB; };
    const int64_t kr = vis.kp_row(b, g), qr = vis.qp_row(b);
    bool any = false;
    for (int64_t kb = 0; kb < s.nkb; ++kb) {
        state[size_t(kb)] = (signed char)vis.state(kr, kb, s.nkb, qr, qb, s.nqb);
        if (state[size_t(kb)] == 0) continue;
        any = true;
        const int64_t j0 = kb * KB, nk = std::min(KB, s.T - j0), nkp = round16(nk);
        gemm_bcast(rows, nkp, s.HS, tb.qs, HSP, 1, kv.kt + kb * s.HS * KB, KB, Pp(kb), KB, false);  // S
        gemm_bcast(rows, nkp, s.HS, tb.dy, HSP, 1, kv.vt + kb * s.HS * KB, KB, dPp(kb), KB, false);  // dP = dy V^T
        if (tb.dcap)
            for (int64_t row = 0; row < rows; ++row) cap_row(Pp(kb) + row * KB, nk, s.cap, tb.dcap + kb * rows * KB + row * KB);
        if (state[size_t(kb)] == 1)
            for (int64_t row = 0; row < rows; ++row) mask_row(Pp(kb) + row * KB, kv.kp + j0, nk, qp[row % nq], s.window);
    }
    std::fill(tb.dq, tb.dq + rows * HSP, A(0));
    if (any) {
        for (int64_t row = 0; row < rows; ++row) {
            A m = neg_inf;
            for (int64_t kb = 0; kb < s.nkb; ++kb)
                if (state[size_t(kb)]) m = std::max(m, row_max(Pp(kb) + row * KB, std::min(KB, s.T - kb * KB)));
            const bool sink = !s.sinks.empty();
            const A sink_logit = sink ? s.sinks[size_t(g * s.R + row / nq)] : A(0);
            if (sink && m != neg_inf) m = std::max(m, sink_logit);
            A l = 0;
            for (int64_t kb = 0; kb < s.nkb; ++kb) {
                if (!state[size_t(kb)]) continue;
                const int64_t nk = std::min(KB, s.T - kb * KB), nkp = round16(nk);
                A* pr = Pp(kb) + row * KB;
                if (m == neg_inf) {  // the row sees nothing: P = 0, so dS = 0
                    std::fill(pr, pr + nkp, A(0));
                    continue;
                }
                A lsum = 0;
#pragma omp simd reduction(+ : lsum)
                for (int64_t j = 0; j < nk; ++j) {
                    pr[j] = kv_exp(pr[j] - m);
                    lsum += pr[j];
                }
                for (int64_t j = nk; j < nkp; ++j) pr[j] = A(0);
                l += lsum;
            }
            const A sink_e = sink && m != neg_inf ? kv_exp(sink_logit - m) : A(0);
            l += sink_e;
            const A inv = l > A(0) ? A(1) / l : A(0);
            A dsum = 0;
            for (int64_t kb = 0; kb < s.nkb; ++kb) {
                if (!state[size_t(kb)]) continue;
                const int64_t nkp = round16(std::min(KB, s.T - kb * KB));
                A* pr = Pp(kb) + row * KB;
                const A* dpr = dPp(kb) + row * KB;
#pragma omp simd reduction(+ : dsum)
                for (int64_t j = 0; j < nkp; ++j) {
                    pr[j] *= inv;
                    dsum += pr[j] * dpr[j];
                }
            }
            if (sink) dsink[g * s.R + row / nq] -= sink_e * inv * dsum;  // a row that sees nothing: dsum = 0
            for (int64_t kb = 0; kb < s.nkb; ++kb) {
                if (!state[size_t(kb)]) continue;
                const int64_t nkp = round16(std::min(KB, s.T - kb * KB));
                const A* pr = Pp(kb) + row * KB;
                A* dpr = dPp(kb) + row * KB;
#pragma omp simd
                for (int64_t j = 0; j < nkp; ++j) dpr[j] = pr[j] * (dpr[j] - dsum);  // dS
                if (tb.dcap) {  // through the cap: dS_raw = dS (1 - tanh^2); P = 0 past nk
                    const A* fr = tb.dcap + kb * rows * KB + row * KB;
                    for (int64_t j = 0; j < std::min(KB, s.T - kb * KB); ++j) dpr[j] *= fr[j];
                }
            }
        }
        for (int64_t kb = 0; kb < s.nkb; ++kb) {
            if (!state[size_t(kb)]) continue;
            const int64_t j0 = kb * KB, nk = std::min(KB, s.T - j0);
            gemm_bcast(nk, HSP, rows, Pp(kb), 1, KB, tb.dy, HSP, dv + j0 * HSP, HSP, true);                  // dv += P^T dy
            gemm_bcast(nk, HSP, rows, dPp(kb), 1, KB, tb.qs, HSP, dk + j0 * HSP, HSP, true);                 // dk += dS^T (alpha q)
            gemm_bcast(rows, HSP, nk, dPp(kb), KB, 1, kv.kn + j0 * kv.ldkn, kv.ldkn, tb.dq, HSP, true);     // dq += dS K
        }
    }
    const TensorView& dqv = c.dst;
    const bool acc = c.p.accumulate & KV_ACC_DST;
    for (int64_t r = 0; r < s.R; ++r)
        for (int64_t i = 0; i < nq; ++i) {
            const A* src = tb.dq + (r * nq + i) * HSP;
            const int64_t off = b * dqv.nb[0] + (g * s.R + r) * dqv.nb[1] + (i0 + i) * dqv.nb[2];
            A* out = row_out_acc<A>(dqv, off, s.HS, 4, acc);
            for (int64_t d = 0; d < s.HS; ++d) out[d] = (acc ? out[d] : A(0)) + s.alpha * src[d];
            row_commit(dqv, off, s.HS, out);
        }
}

// dst (B, G, T, HS) of pair p = (acc ? dst : 0) + sum of the given (T, HSP) partials.
template <class A>
void store_pair_grad(const TensorView& d, const SdpaShape<A>& s, int64_t p, const std::vector<const A*>& parts, bool acc) {
    const int64_t b = p / s.G, g = p % s.G;
    for (int64_t j = 0; j < s.T; ++j) {
        const int64_t off = b * d.nb[0] + g * d.nb[1] + j * d.nb[2];
        A* out = row_out_acc<A>(d, off, s.HS, 4, acc);
        if (!acc) std::fill(out, out + s.HS, A(0));
        for (const A* part : parts)
            for (int64_t k = 0; k < s.HS; ++k) out[k] += part[j * s.HSP + k];
        row_commit(d, off, s.HS, out);
    }
}

// dst4 (NH) = (acc ? dst4 : 0) + the per-thread sink partials in thread order.
template <class A>
void store_sink_grad(const OpCall& c, const SdpaShape<A>& s, const std::vector<std::vector<A>>& parts) {
    if (!c.dst4.data) return;
    std::vector<A> sum((size_t)s.NH, A(0));
    if (c.p.accumulate & KV_ACC_DST4) load_row(c.dst4.bytes(), c.dst4.nb[0], c.dst4.dtype, s.NH, sum.data());
    for (const auto& part : parts)
        if (part.size() == size_t(s.NH))  // empty without sinks: dsink is zero
            for (int64_t h = 0; h < s.NH; ++h) sum[size_t(h)] += part[size_t(h)];
    store_row(c.dst4.bytes(), c.dst4.nb[0], c.dst4.dtype, s.NH, sum.data());
}

template <class A>
void sdpa_backward_run(const OpContext& ctx, const OpCall& c) {
    SdpaShape<A> s = sdpa_shape<A>(c);
    const int threads = std::max(1, kernel_threads(ctx));
    const int64_t budget = c.p.max_temp_bytes > 0 ? c.p.max_temp_bytes : kDefaultTempBytes;
    const int64_t per_query = std::max<int64_t>(1, 2 * s.R * s.nkb * kKeyBlock * int64_t(sizeof(A)));
    set_query_block(s, budget / (int64_t(threads) * per_query));
    const bool acc_k = c.p.accumulate & KV_ACC_DST2, acc_v = c.p.accumulate & KV_ACC_DST3;
    if (s.tasks == 0) {  // no queries (or no heads): dq is empty, dk/dv receive zero
        for (int64_t p = 0; p < s.pairs; ++p) {
            store_pair_grad<A>(c.dst2, s, p, {}, acc_k);
            store_pair_grad<A>(c.dst3, s, p, {}, acc_v);
        }
        store_sink_grad<A>(c, s, {});
        return;
    }
    const Visibility vis = visibility(c, s);
    const int nt = int(std::min<int64_t>(threads, s.tasks));
    const std::vector<int64_t> begin = partition_tasks(s, vis, nt);
    const int needs = NEED_KT | NEED_VT | NEED_KN;
    const int64_t per_thread = BwdBufs<A>::size(s) + pair_storage(s, needs);
    std::vector<int64_t> gofs((size_t)nt + 1, 0);  // per-thread dk, dv partials: 2 (T, HSP) per pair
    for (int t = 0; t < nt; ++t) {
        const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
        const int64_t npairs = t1 > t0 ? (t1 - 1) / s.nqb - t0 / s.nqb + 1 : 0;
        gofs[size_t(t + 1)] = gofs[size_t(t)] + npairs * 2 * s.Tp * s.HSP;
    }
    KernelScratch mem(ctx, size_t(per_thread * nt + gofs[size_t(nt)]) * sizeof(A));
    A* gpart = mem.as<A>() + per_thread * nt;
    std::vector<std::vector<A>> dsink((size_t)nt, std::vector<A>(s.sinks.empty() ? 0 : size_t(s.NH), A(0)));

    auto run = [&](int t) {
        const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
        if (t1 <= t0) return;
        A* base = mem.as<A>() + per_thread * t;
        BwdBufs<A> tb;
        tb.carve(s, base);
        A* pair_store = base + BwdBufs<A>::size(s);
        A* mine = gpart + gofs[size_t(t)];
        std::fill(mine, gpart + gofs[size_t(t + 1)], A(0));
        std::vector<signed char> state((size_t)s.nkb, 0);
        int64_t cur = -1;
        PairKV<A> kv;
        for (int64_t task = t0; task < t1; ++task) {
            const int64_t p = task / s.nqb, qb = task % s.nqb, b = p / s.G, g = p % s.G;
            if (p != cur) {
                kv = convert_pair(c, s, b, g, needs, pair_store);
                cur = p;
            }
            A* dk = mine + (p - t0 / s.nqb) * 2 * s.Tp * s.HSP;
            bwd_task(c, s, vis, kv, b, g, qb, tb, dk, dk + s.Tp * s.HSP, dsink[size_t(t)].data(), state);
        }
    };
    run_ranges(nt, run);
    for (int64_t p = 0; p < s.pairs; ++p) {
        std::vector<const A*> pk, pv;
        for (int t = 0; t < nt; ++t) {
            const int64_t t0 = begin[size_t(t)], t1 = begin[size_t(t + 1)];
            if (t1 <= t0 || p < t0 / s.nqb || p > (t1 - 1) / s.nqb) continue;
            const A* part = gpart + gofs[size_t(t)] + (p - t0 / s.nqb) * 2 * s.Tp * s.HSP;
            pk.push_back(part);
            pv.push_back(part + s.Tp * s.HSP);
        }
        store_pair_grad<A>(c.dst2, s, p, pk, acc_k);
        store_pair_grad<A>(c.dst3, s, p, pv, acc_v);
    }
    store_sink_grad<A>(c, s, dsink);
}

}  // namespace

void sdpa_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) {
        sdpa_forward_run<double>(ctx, c);
        return;
    }
    const SdpaShape<float> s = sdpa_shape<float>(c);
    if (decode_applies(c, s) && s.pairs > 0) {
        if (c.src[1].dtype == DType::F32) sdpa_decode<float>(ctx, c, s);
        else sdpa_decode<uint16_t>(ctx, c, s);
        return;
    }
    sdpa_forward_run<float>(ctx, c);
}

void sdpa_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) sdpa_backward_run<double>(ctx, c);
    else sdpa_backward_run<float>(ctx, c);
}

}  // namespace kv::cpu
