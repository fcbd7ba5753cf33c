// SDPA on CUDA. f32-accumulated calls with head size 32, 64 or 128 take the tiled kernels at
// the end of this file (32 (query, head) rows of one KV group per block, K/V tiles in shared
// memory, keys split across blocks for decode). The rest (f64, other head sizes) take the
// simple kernel: one block per (query, head, batch); each warp streams a strided subset of
// slots with its own online softmax (m, l, acc[HS] in shared memory), warps are merged at
// the end. Weight sums take a second pass recomputing q.k with the final m and l and add
// exp(s - m) / l / R into w[b, g, j] with atomics. Same masking rule as the CPU kernel.
// SDPA_BACKWARD uses the same block layout and three passes over the slots (m and l; D =
// sum p (dy.v); then dS per slot), recomputing q.k and dy.v instead of storing any score
// block, so it needs no temporary memory (max_temp_bytes is moot); dk/dv are atomic adds.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "cuda_common.cuh"
#include "kernels/common/online_softmax.h"

namespace kv::cuda {

namespace {
constexpr int kWarps = 4;
constexpr int kMaxHS = 256;

template <class A>
__device__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <class A>
__device__ A dot_qk(const A* qs, const TensorView& k, const char* kbase, long long j, long long HS, int lane) {
    A part = 0;
    for (long long d = lane; d < HS; d += 32) part += qs[d] * load_elem<A>(kbase + j * k.nb[2] + d * k.nb[3], k.dtype);
    return warp_sum(part);
}

template <class A>
__global__ void sdpa_kernel(TensorView y, TensorView q, TensorView k, TensorView v, TensorView kpos, TensorView qpos,
                            TensorView w, int weights, float alpha, int window) {
    __shared__ A qs[kMaxHS];
    __shared__ A acc[kWarps][kMaxHS];
    __shared__ A wm[kWarps], wl[kWarps];
    const long long i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const long long NH = q.ne[1], HS = q.ne[3], G = k.ne[1], T = k.ne[2], R = NH / G, g = h / R;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long d = threadIdx.x; d < HS; d += blockDim.x)
        qs[d] = A(alpha) * load_elem<A>(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2] + d * q.nb[3], q.dtype);
    for (long long d = lane; d < HS; d += 32) acc[warp][d] = 0;
    __syncthreads();
    const int qp = *reinterpret_cast<const int*>(qpos.bytes() + (qpos.ne[0] == 1 ? 0 : b) * qpos.nb[0] + i * qpos.nb[1]);
    const char* kp_base = kpos.bytes() + (kpos.ne[0] == 1 ? 0 : b) * kpos.nb[0] + (kpos.ne[1] == 1 ? 0 : g) * kpos.nb[1];
    const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
    const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
    A m = -INFINITY, l = 0;
    for (long long j = warp; j < T; j += kWarps) {
        const int p = *reinterpret_cast<const int*>(kp_base + j * kpos.nb[2]);
        if (p > qp || (window > 0 && p <= qp - window)) continue;
        const SoftmaxStep<A> st = online_softmax_push(m, l, dot_qk(qs, k, kbase, j, HS, lane));
        for (long long d = lane; d < HS; d += 32)
            acc[warp][d] = acc[warp][d] * st.corr + st.e * load_elem<A>(vbase + j * v.nb[2] + d * v.nb[3], v.dtype);
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    A mt, lt;
    online_softmax_merge(wm, wl, kWarps, mt, lt);
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        A o = 0;
        for (int u = 0; u < kWarps; ++u) o += acc[u][d] * online_softmax_scale(wm[u], mt);
        store_elem<A>(y.bytes() + b * y.nb[0] + h * y.nb[1] + i * y.nb[2] + d * y.nb[3], y.dtype, lt > A(0) ? o / lt : A(0));
    }
    if (!weights || !(lt > A(0))) return;
    for (long long j = warp; j < T; j += kWarps) {
        const int p = *reinterpret_cast<const int*>(kp_base + j * kpos.nb[2]);
        if (p > qp || (window > 0 && p <= qp - window)) continue;
        const A s = dot_qk(qs, k, kbase, j, HS, lane);
        if (lane == 0) atomicAdd(reinterpret_cast<A*>(w.bytes() + b * w.nb[0] + g * w.nb[1] + j * w.nb[2]), kv_exp(s - mt) / lt / A(R));
    }
}

template <class A>
__global__ void sdpa_backward_kernel(TensorView dq, TensorView dk, TensorView dv, TensorView q, TensorView k, TensorView v,
                                     TensorView kpos, TensorView qpos, TensorView dy, float alpha, int window, int acc_q) {
    __shared__ A qs[kMaxHS];  // alpha q
    __shared__ A gs[kMaxHS];  // dy
    __shared__ A dqs[kWarps][kMaxHS];
    __shared__ A wm[kWarps], wl[kWarps], wd[kWarps];
    const long long i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const long long NH = q.ne[1], HS = q.ne[3], G = k.ne[1], T = k.ne[2], R = NH / G, g = h / R;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        qs[d] = A(alpha) * load_elem<A>(q.bytes() + b * q.nb[0] + h * q.nb[1] + i * q.nb[2] + d * q.nb[3], q.dtype);
        gs[d] = load_elem<A>(dy.bytes() + b * dy.nb[0] + h * dy.nb[1] + i * dy.nb[2] + d * dy.nb[3], dy.dtype);
    }
    for (long long d = lane; d < HS; d += 32) dqs[warp][d] = 0;
    __syncthreads();
    const int qp = *reinterpret_cast<const int*>(qpos.bytes() + (qpos.ne[0] == 1 ? 0 : b) * qpos.nb[0] + i * qpos.nb[1]);
    const char* kp_base = kpos.bytes() + (kpos.ne[0] == 1 ? 0 : b) * kpos.nb[0] + (kpos.ne[1] == 1 ? 0 : g) * kpos.nb[1];
    const char* kbase = k.bytes() + b * k.nb[0] + g * k.nb[1];
    const char* vbase = v.bytes() + b * v.nb[0] + g * v.nb[1];
    // Pass 1: softmax statistics.
    A m = -INFINITY, l = 0;
    for (long long j = warp; j < T; j += kWarps) {
        const int p = *reinterpret_cast<const int*>(kp_base + j * kpos.nb[2]);
        if (p > qp || (window > 0 && p <= qp - window)) continue;
        online_softmax_push(m, l, dot_qk(qs, k, kbase, j, HS, lane));
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
    __syncthreads();
    A mt, lt;
    online_softmax_merge(wm, wl, kWarps, mt, lt);
    // Pass 2: D = sum_j p_j (dy . v_j).
    A dsum = 0;
    if (lt > A(0))
        for (long long j = warp; j < T; j += kWarps) {
            const int p = *reinterpret_cast<const int*>(kp_base + j * kpos.nb[2]);
            if (p > qp || (window > 0 && p <= qp - window)) continue;
            const A pr = kv_exp(dot_qk(qs, k, kbase, j, HS, lane) - mt) / lt;
            dsum += pr * dot_qk(gs, v, vbase, j, HS, lane);
        }
    if (lane == 0) wd[warp] = dsum;
    __syncthreads();
    A D = 0;
    for (int u = 0; u < kWarps; ++u) D += wd[u];
    // Pass 3: dS_j = p_j (dy.v_j - D); dq += alpha dS_j k_j; dk_j += dS_j (alpha q); dv_j += p_j dy.
    if (lt > A(0))
        for (long long j = warp; j < T; j += kWarps) {
            const int p = *reinterpret_cast<const int*>(kp_base + j * kpos.nb[2]);
            if (p > qp || (window > 0 && p <= qp - window)) continue;
            const A pr = kv_exp(dot_qk(qs, k, kbase, j, HS, lane) - mt) / lt;
            const A ds = pr * (dot_qk(gs, v, vbase, j, HS, lane) - D);
            for (long long d = lane; d < HS; d += 32) {
                dqs[warp][d] += A(alpha) * ds * load_elem<A>(kbase + j * k.nb[2] + d * k.nb[3], k.dtype);
                atomic_add_elem<A>(dk.bytes() + b * dk.nb[0] + g * dk.nb[1] + j * dk.nb[2] + d * dk.nb[3], dk.dtype, ds * qs[d]);
                atomic_add_elem<A>(dv.bytes() + b * dv.nb[0] + g * dv.nb[1] + j * dv.nb[2] + d * dv.nb[3], dv.dtype, pr * gs[d]);
            }
        }
    __syncthreads();
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        A o = 0;
        for (int u = 0; u < kWarps; ++u) o += dqs[u][d];
        char* out = dq.bytes() + b * dq.nb[0] + h * dq.nb[1] + i * dq.nb[2] + d * dq.nb[3];
        if (acc_q) o += load_elem<A>(out, dq.dtype);
        store_elem<A>(out, dq.dtype, o);
    }
}

__global__ void zero_f32(TensorView w) {
    long long n = dev_numel(w);
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        store_elem<float>(w.bytes() + elem_offset(w, e), w.dtype, 0.0f);
}

// ---- tiled SDPA (f32 accumulation, head sizes 32/64/128) ------------------------------------
// The simple kernel above gives every (query, head) one block and every key a warp reduction;
// on an H200 it ran at 0.1x of PyTorch's SDPA and made decode and prefill SDPA-bound
// (docs/GPU.md). Here a block takes 32 query rows of one (batch, KV group): the rows are
// (query, head) pairs of the group's R heads, so GQA heads share every K/V tile they load.
// Each warp owns 8 rows; per 64-key tile a lane scores 2 keys for its warp's 8 rows from
// shared memory, the warp keeps an online softmax per row, and P·V accumulates in registers
// (D/32 dims per lane). Keys are split across blocks when rows are few (decode: 7 rows per
// group), each split writing (m, l, unnormalized o) that a second kernel merges. Weight sums
// recompute the scores once the final m and l are known.
constexpr int kFaWarps = 4, kFaRowsPerWarp = 8, kFaRows = kFaWarps * kFaRowsPerWarp, kFaKeys = 64;

struct FaArgs {
    TensorView q, k, v, kpos, qpos;
    float alpha;
    int window;
    long long R, rows, T, keys_per_split;  // rows = n * R per (b, g)
    int row_tiles, nsplit;
};

__device__ __forceinline__ float fa_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float fa_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Shared memory of one block: Q rows (alpha-scaled), a K tile padded to D + 1 floats per key
// (lanes read different keys at the same d: no bank conflicts), a V tile, each warp's P rows,
// the tile's key positions.
template <int D>
constexpr size_t fa_smem_bytes() {
    return sizeof(float) * (size_t(kFaRows) * D + size_t(kFaKeys) * (D + 1) + size_t(kFaKeys) * D + size_t(kFaRows) * kFaKeys) +
           sizeof(int) * kFaKeys;
}

struct FaRow {
    long long b, g, h, i;
    int qp;
    bool valid;
};

__device__ __forceinline__ FaRow fa_row(const FaArgs& a, long long bg, long long rho) {
    const long long G = a.k.ne[1];
    FaRow r;
    r.b = bg / G;
    r.g = bg % G;
    r.valid = rho < a.rows;
    r.i = r.valid ? rho / a.R : 0;
    r.h = r.g * a.R + (r.valid ? rho % a.R : 0);
    r.qp = r.valid ? *reinterpret_cast<const int*>(a.qpos.bytes() + (a.qpos.ne[0] == 1 ? 0 : r.b) * a.qpos.nb[0] + r.i * a.qpos.nb[1])
                   : INT_MIN;
    return r;
}

// The smallest and largest query position among the block's valid rows (thread 0 only).
__device__ void fa_query_range(const FaArgs& a, long long bg, long long row0, int* lo, int* hi) {
    int l = INT_MAX, h = INT_MIN;
    for (int rr = 0; rr < kFaRows; ++rr) {
        const FaRow r = fa_row(a, bg, row0 + rr);
        if (!r.valid) continue;
        l = min(l, r.qp);
        h = max(h, r.qp);
    }
    *lo = l;
    *hi = h;
}

// Load this block's Q rows (alpha-scaled; rows past the end are zero).
template <int D>
__device__ void fa_load_q(const FaArgs& a, long long bg, long long row0, float* Qs) {
    for (int e = threadIdx.x; e < kFaRows * D; e += blockDim.x) {
        const int rr = e / D, d = e % D;
        const FaRow r = fa_row(a, bg, row0 + rr);
        Qs[e] = r.valid ? a.alpha * load_elem<float>(a.q.bytes() + r.b * a.q.nb[0] + r.h * a.q.nb[1] + r.i * a.q.nb[2] + d * a.q.nb[3], a.q.dtype)
                        : 0.0f;
    }
}

// Load keys [j0, j0 + 64) ∩ [j0, j_end) of K (and V when Vs) into shared memory; positions of
// keys past j_end are INT_MAX (masked for every query).
template <int D>
__device__ void fa_load_kv(const FaArgs& a, long long b, long long g, long long j0, long long j_end, float* Ks, float* Vs, int* kps) {
    const char* kb = a.k.bytes() + b * a.k.nb[0] + g * a.k.nb[1];
    const char* vb = a.v.bytes() + b * a.v.nb[0] + g * a.v.nb[1];
    const char* pb = a.kpos.bytes() + (a.kpos.ne[0] == 1 ? 0 : b) * a.kpos.nb[0] + (a.kpos.ne[1] == 1 ? 0 : g) * a.kpos.nb[1];
    for (int e = threadIdx.x; e < kFaKeys * D; e += blockDim.x) {
        const int key = e / D, d = e % D;
        const long long j = j0 + key;
        const bool in = j < j_end;
        Ks[key * (D + 1) + d] = in ? load_elem<float>(kb + j * a.k.nb[2] + d * a.k.nb[3], a.k.dtype) : 0.0f;
        if (Vs) Vs[key * D + d] = in ? load_elem<float>(vb + j * a.v.nb[2] + d * a.v.nb[3], a.v.dtype) : 0.0f;
    }
    for (int key = threadIdx.x; key < kFaKeys; key += blockDim.x) {
        const long long j = j0 + key;
        kps[key] = j < j_end ? *reinterpret_cast<const int*>(pb + j * a.kpos.nb[2]) : INT_MAX;
    }
}

__device__ __forceinline__ bool fa_visible(int kp, int qp, int window) {
    return kp != INT_MAX && kp <= qp && (window <= 0 || kp > qp - window);
}

// Scores of this lane's 2 keys for its warp's 8 rows (masked ones -inf).
template <int D>
__device__ __forceinline__ void fa_scores(const float* Qs, const float* Ks, const int* kps, const int* qp, int window, int warp, int lane,
                                          float (&s)[kFaRowsPerWarp][2]) {
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) s[rr][0] = s[rr][1] = 0.0f;
    const float* q0 = Qs + warp * kFaRowsPerWarp * D;
    const float* k0 = Ks + lane * (D + 1);
    const float* k1 = Ks + (lane + 32) * (D + 1);
#pragma unroll 8
    for (int d = 0; d < D; ++d) {
        const float ka = k0[d], kb = k1[d];
#pragma unroll
        for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
            const float qv = q0[rr * D + d];
            s[rr][0] = fmaf(qv, ka, s[rr][0]);
            s[rr][1] = fmaf(qv, kb, s[rr][1]);
        }
    }
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
        if (!fa_visible(kps[lane], qp[rr], window)) s[rr][0] = -INFINITY;
        if (!fa_visible(kps[lane + 32], qp[rr], window)) s[rr][1] = -INFINITY;
    }
}

// Whether any row of the block sees any key of the tile (causal prefill skips half the tiles).
__device__ __forceinline__ bool fa_tile_visible(const int* kps, int qp_min, int qp_max, int window) {
    int any = 0;
    for (int key = threadIdx.x; key < kFaKeys; key += blockDim.x) {
        const int kp = kps[key];
        if (kp != INT_MAX && kp <= qp_max && (window <= 0 || kp > qp_min - window)) any = 1;
    }
    return __syncthreads_or(any) != 0;
}

template <int D>
__global__ void __launch_bounds__(kFaWarps * 32) fa_partial_kernel(FaArgs a, float* part_ml, float* part_o) {
    extern __shared__ float fa_smem[];
    float* Qs = fa_smem;
    float* Ks = Qs + kFaRows * D;
    float* Vs = Ks + kFaKeys * (D + 1);
    float* Ps = Vs + kFaKeys * D;
    int* kps = reinterpret_cast<int*>(Ps + kFaRows * kFaKeys);
    __shared__ int qp_lo, qp_hi;
    const long long tile = blockIdx.x, bg = blockIdx.y, split = blockIdx.z, row0 = tile * kFaRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long G = a.k.ne[1], b = bg / G, g = bg % G;
    fa_load_q<D>(a, bg, row0, Qs);
    int qp[kFaRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) qp[rr] = fa_row(a, bg, row0 + warp * kFaRowsPerWarp + rr).qp;
    if (threadIdx.x == 0) fa_query_range(a, bg, row0, &qp_lo, &qp_hi);
    float m[kFaRowsPerWarp], l[kFaRowsPerWarp], o[kFaRowsPerWarp][D / 32];
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int t = 0; t < D / 32; ++t) o[rr][t] = 0.0f;
    }
    const long long j_begin = split * a.keys_per_split, j_end = min(a.T, j_begin + a.keys_per_split);
    for (long long j0 = j_begin; j0 < j_end; j0 += kFaKeys) {
        __syncthreads();  // the previous tile is no longer read
        fa_load_kv<D>(a, b, g, j0, j_end, Ks, Vs, kps);
        __syncthreads();
        if (!fa_tile_visible(kps, qp_lo, qp_hi, a.window)) continue;
        float s[kFaRowsPerWarp][2];
        fa_scores<D>(Qs, Ks, kps, qp, a.window, warp, lane, s);
        float* P = Ps + warp * kFaRowsPerWarp * kFaKeys;
#pragma unroll
        for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
            const float m_new = fmaxf(m[rr], fa_warp_max(fmaxf(s[rr][0], s[rr][1])));
            float p0 = 0.0f, p1 = 0.0f, corr = 1.0f;
            if (m_new != -INFINITY) {
                corr = online_softmax_scale(m[rr], m_new);
                p0 = s[rr][0] == -INFINITY ? 0.0f : kv_exp(s[rr][0] - m_new);
                p1 = s[rr][1] == -INFINITY ? 0.0f : kv_exp(s[rr][1] - m_new);
            }
            l[rr] = l[rr] * corr + fa_warp_sum(p0 + p1);
#pragma unroll
            for (int t = 0; t < D / 32; ++t) o[rr][t] *= corr;
            m[rr] = m_new;
            P[rr * kFaKeys + lane] = p0;
            P[rr * kFaKeys + lane + 32] = p1;
        }
        __syncwarp();
        for (int j = 0; j < kFaKeys; ++j) {
            float vv[D / 32];
#pragma unroll
            for (int t = 0; t < D / 32; ++t) vv[t] = Vs[j * D + lane + 32 * t];
#pragma unroll
            for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
                const float p = P[rr * kFaKeys + j];
#pragma unroll
                for (int t = 0; t < D / 32; ++t) o[rr][t] = fmaf(p, vv[t], o[rr][t]);
            }
        }
    }
    // Partials, indexed (split, bg, row) over row_tiles * kFaRows rows per bg.
    const long long rows_pad = (long long)a.row_tiles * kFaRows;
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
        const long long row = row0 + warp * kFaRowsPerWarp + rr;
        const long long idx = (split * (long long)gridDim.y + bg) * rows_pad + row;
        if (lane == 0) {
            part_ml[2 * idx] = m[rr];
            part_ml[2 * idx + 1] = l[rr];
        }
#pragma unroll
        for (int t = 0; t < D / 32; ++t) part_o[idx * D + lane + 32 * t] = o[rr][t];
    }
}

// One warp per row: merge the splits' (m, l, o), write y and the row's final (m, l).
template <int D>
__global__ void fa_combine_kernel(FaArgs a, TensorView y, const float* part_ml, const float* part_o, float* final_ml, long long bgs) {
    const long long rows_pad = (long long)a.row_tiles * kFaRows;
    const long long gw = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (gw >= bgs * rows_pad) return;
    const long long bg = gw / rows_pad, row = gw % rows_pad;
    const FaRow r = fa_row(a, bg, row);
    if (!r.valid) return;
    float M = -INFINITY;
    for (int s = 0; s < a.nsplit; ++s) M = fmaxf(M, part_ml[2 * ((s * bgs + bg) * rows_pad + row)]);
    float L = 0.0f, acc[D / 32];
#pragma unroll
    for (int t = 0; t < D / 32; ++t) acc[t] = 0.0f;
    if (M != -INFINITY)
        for (int s = 0; s < a.nsplit; ++s) {
            const long long idx = (s * bgs + bg) * rows_pad + row;
            const float ms = part_ml[2 * idx];
            if (ms == -INFINITY) continue;
            const float f = kv_exp(ms - M);
            L += part_ml[2 * idx + 1] * f;
#pragma unroll
            for (int t = 0; t < D / 32; ++t) acc[t] += part_o[idx * D + lane + 32 * t] * f;
        }
#pragma unroll
    for (int t = 0; t < D / 32; ++t) {
        const long long d = lane + 32 * t;
        store_elem<float>(y.bytes() + r.b * y.nb[0] + r.h * y.nb[1] + r.i * y.nb[2] + d * y.nb[3], y.dtype, L > 0.0f ? acc[t] / L : 0.0f);
    }
    if (lane == 0) {
        final_ml[2 * (bg * rows_pad + row)] = M;
        final_ml[2 * (bg * rows_pad + row) + 1] = L;
    }
}

// Weight sums: w[b, g, j] += sum over the block's rows of exp(s - M) / L / R, one atomic per key
// and block.
template <int D>
__global__ void __launch_bounds__(kFaWarps * 32) fa_weights_kernel(FaArgs a, TensorView w, const float* final_ml) {
    extern __shared__ float fa_smem[];
    float* Qs = fa_smem;
    float* Ks = Qs + kFaRows * D;
    float* Ws = Ks + kFaKeys * (D + 1);  // (warps, keys) per-warp sums
    int* kps = reinterpret_cast<int*>(Ws + kFaWarps * kFaKeys);
    __shared__ int qp_lo, qp_hi;
    const long long tile = blockIdx.x, bg = blockIdx.y, split = blockIdx.z, row0 = tile * kFaRows;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const long long G = a.k.ne[1], b = bg / G, g = bg % G;
    const long long rows_pad = (long long)a.row_tiles * kFaRows;
    fa_load_q<D>(a, bg, row0, Qs);
    int qp[kFaRowsPerWarp];
    float M[kFaRowsPerWarp], invL[kFaRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
        const long long row = row0 + warp * kFaRowsPerWarp + rr;
        const FaRow r = fa_row(a, bg, row);
        qp[rr] = r.qp;
        M[rr] = r.valid ? final_ml[2 * (bg * rows_pad + row)] : -INFINITY;
        const float L = r.valid ? final_ml[2 * (bg * rows_pad + row) + 1] : 0.0f;
        invL[rr] = L > 0.0f ? 1.0f / (L * float(a.R)) : 0.0f;
    }
    if (threadIdx.x == 0) fa_query_range(a, bg, row0, &qp_lo, &qp_hi);
    const long long j_begin = split * a.keys_per_split, j_end = min(a.T, j_begin + a.keys_per_split);
    for (long long j0 = j_begin; j0 < j_end; j0 += kFaKeys) {
        __syncthreads();
        fa_load_kv<D>(a, b, g, j0, j_end, Ks, nullptr, kps);
        __syncthreads();
        if (!fa_tile_visible(kps, qp_lo, qp_hi, a.window)) continue;
        float s[kFaRowsPerWarp][2];
        fa_scores<D>(Qs, Ks, kps, qp, a.window, warp, lane, s);
        float w0 = 0.0f, w1 = 0.0f;
#pragma unroll
        for (int rr = 0; rr < kFaRowsPerWarp; ++rr) {
            if (M[rr] == -INFINITY) continue;
            if (s[rr][0] != -INFINITY) w0 += kv_exp(s[rr][0] - M[rr]) * invL[rr];
            if (s[rr][1] != -INFINITY) w1 += kv_exp(s[rr][1] - M[rr]) * invL[rr];
        }
        Ws[warp * kFaKeys + lane] = w0;
        Ws[warp * kFaKeys + lane + 32] = w1;
        __syncthreads();
        for (int key = threadIdx.x; key < kFaKeys; key += blockDim.x) {
            const long long j = j0 + key;
            if (j >= j_end) continue;
            float sum = 0.0f;
            for (int u = 0; u < kFaWarps; ++u) sum += Ws[u * kFaKeys + key];
            if (sum != 0.0f) atomicAdd(reinterpret_cast<float*>(w.bytes() + b * w.nb[0] + g * w.nb[1] + j * w.nb[2]), sum);
        }
    }
}

template <int D>
void fa_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    FaArgs a;
    a.q = q;
    a.k = c.src[1];
    a.v = c.src[2];
    a.kpos = c.src[3];
    a.qpos = c.src[4];
    a.alpha = c.p.alpha;
    a.window = c.p.window;
    const long long B = q.ne[0], NH = q.ne[1], n = q.ne[2], G = a.k.ne[1];
    a.R = NH / G;
    a.rows = n * a.R;
    a.T = a.k.ne[2];
    a.row_tiles = int((a.rows + kFaRows - 1) / kFaRows);
    const long long bgs = B * G;
    // Enough blocks to fill the GPU twice over: split the keys when the rows alone give fewer.
    static int sms = [] {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) v = 80;
        return v > 0 ? v : 80;
    }();
    const long long tiles_of_keys = std::max<long long>(1, (a.T + kFaKeys - 1) / kFaKeys);
    long long nsplit = std::max<long long>(1, (2LL * sms + bgs * a.row_tiles - 1) / (bgs * a.row_tiles));
    nsplit = std::min(nsplit, tiles_of_keys);
    a.keys_per_split = ((tiles_of_keys + nsplit - 1) / nsplit) * kFaKeys;
    a.nsplit = int((a.T + a.keys_per_split - 1) / a.keys_per_split);
    if (a.nsplit < 1) a.nsplit = 1;
    const long long rows_pad = (long long)a.row_tiles * kFaRows;
    DeviceScratch scratch(ctx, sizeof(float) * size_t(a.nsplit * bgs * rows_pad * (D + 2) + bgs * rows_pad * 2));
    float* part_ml = scratch.as<float>();
    float* part_o = part_ml + 2 * a.nsplit * bgs * rows_pad;
    float* final_ml = part_o + size_t(a.nsplit) * bgs * rows_pad * D;
    const size_t smem = fa_smem_bytes<D>();
    static bool attr_set = false;  // opt in to more than 48 KiB of dynamic shared memory once
    if (!attr_set) {
        KV_CUDA_CHECK(cudaFuncSetAttribute(fa_partial_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        KV_CUDA_CHECK(cudaFuncSetAttribute(fa_weights_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        attr_set = true;
    }
    dim3 grid(unsigned(a.row_tiles), unsigned(bgs), unsigned(a.nsplit));
    fa_partial_kernel<D><<<grid, kFaWarps * 32, smem, stream_of(ctx)>>>(a, part_ml, part_o);
    KV_CUDA_CHECK_LAUNCH();
    const long long warps = bgs * rows_pad;
    fa_combine_kernel<D><<<blocks_for(warps * 32, 256), 256, 0, stream_of(ctx)>>>(a, c.dst, part_ml, part_o, final_ml, bgs);
    KV_CUDA_CHECK_LAUNCH();
    if (c.dst2.data) {  // zeroed by sdpa_forward
        fa_weights_kernel<D><<<grid, kFaWarps * 32, smem, stream_of(ctx)>>>(a, c.dst2, final_ml);
        KV_CUDA_CHECK_LAUNCH();
    }
}
}  // namespace

void sdpa_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    if (q.ne[3] > kMaxHS) throw KernelError("cuda sdpa: head size above 256 is not supported");
    if (q.numel() == 0) return;
    const bool weights = c.dst2.data != nullptr;
    const bool f64 = is_f64_call(c);
    if (weights) {
        if ((f64 && c.dst2.dtype != DType::F64) || (!f64 && c.dst2.dtype != DType::F32))
            throw KernelError("cuda sdpa: weight sums must be f32 (f64 for f64 calls)");
        zero_f32<<<blocks_for(c.dst2.numel(), 256), 256, 0, stream_of(ctx)>>>(c.dst2);
        KV_CUDA_CHECK_LAUNCH();
    }
    // The tiled kernels for f32 accumulation and the usual head sizes; the simple kernel for
    // the rest (f64, odd head sizes).
    const long long HS = q.ne[3];
    if (!f64 && q.ne[1] % c.src[1].ne[1] == 0 && (HS == 32 || HS == 64 || HS == 128)) {
        if (HS == 32) fa_forward<32>(ctx, c);
        else if (HS == 64) fa_forward<64>(ctx, c);
        else fa_forward<128>(ctx, c);
        return;
    }
    dim3 grid(unsigned(q.ne[2]), unsigned(q.ne[1]), unsigned(q.ne[0]));
    if (f64)
        sdpa_kernel<double><<<grid, 32 * kWarps, 0, stream_of(ctx)>>>(c.dst, q, c.src[1], c.src[2], c.src[3], c.src[4], c.dst2,
                                                                       weights, c.p.alpha, c.p.window);
    else
        sdpa_kernel<float><<<grid, 32 * kWarps, 0, stream_of(ctx)>>>(c.dst, q, c.src[1], c.src[2], c.src[3], c.src[4], c.dst2,
                                                                      weights, c.p.alpha, c.p.window);
    KV_CUDA_CHECK_LAUNCH();
}

void sdpa_backward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    if (q.ne[3] > kMaxHS) throw KernelError("cuda sdpa_backward: head size above 256 is not supported");
    const bool f64 = is_f64_call(c);
    const DType want = f64 ? DType::F64 : DType::F32;
    if (c.dst2.dtype != want || c.dst3.dtype != want)
        throw KernelError("cuda sdpa_backward: dk and dv must be f32 (f64 for f64 calls): they are accumulated with atomics");
    if (!(c.p.accumulate & KV_ACC_DST2)) zero_view(ctx, c.dst2);
    if (!(c.p.accumulate & KV_ACC_DST3)) zero_view(ctx, c.dst3);
    if (q.numel() == 0) return;
    dim3 grid(unsigned(q.ne[2]), unsigned(q.ne[1]), unsigned(q.ne[0]));
    const int acc_q = (c.p.accumulate & KV_ACC_DST) != 0;
    if (f64)
        sdpa_backward_kernel<double><<<grid, 32 * kWarps, 0, stream_of(ctx)>>>(c.dst, c.dst2, c.dst3, q, c.src[1], c.src[2], c.src[3],
                                                                                c.src[4], c.src[5], c.p.alpha, c.p.window, acc_q);
    else
        sdpa_backward_kernel<float><<<grid, 32 * kWarps, 0, stream_of(ctx)>>>(c.dst, c.dst2, c.dst3, q, c.src[1], c.src[2], c.src[3],
                                                                               c.src[4], c.src[5], c.p.alpha, c.p.window, acc_q);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
