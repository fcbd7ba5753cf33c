// SDPA on CUDA: one block per (query, head, batch); each warp streams a strided subset of
// slots with its own online softmax (m, l, acc[HS] in shared memory), warps are merged at
// the end. Weight sums take a second pass recomputing q.k with the final m and l and add
// exp(s - m) / l / R into w[b, g, j] with atomics. Same masking rule as the CPU kernel.
// SDPA_BACKWARD uses the same block layout and three passes over the slots (m and l; D =
// sum p (dy.v); then dS per slot), recomputing q.k and dy.v instead of storing any score
// block, so it needs no temporary memory (max_temp_bytes is moot); dk/dv are atomic adds.
#include <cfloat>

#include "cuda_common.cuh"

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
        const A s = dot_qk(qs, k, kbase, j, HS, lane);
        const A m_new = s > m ? s : m;
        const A corr = m == -INFINITY ? A(0) : kv_exp(m - m_new);
        const A e = kv_exp(s - m_new);
        l = l * corr + e;
        for (long long d = lane; d < HS; d += 32)
            acc[warp][d] = acc[warp][d] * corr + e * load_elem<A>(vbase + j * v.nb[2] + d * v.nb[3], v.dtype);
        m = m_new;
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    A mt = -INFINITY;
    for (int u = 0; u < kWarps; ++u) mt = wm[u] > mt ? wm[u] : mt;
    A lt = 0;
    for (int u = 0; u < kWarps; ++u) lt += wm[u] == -INFINITY ? A(0) : wl[u] * kv_exp(wm[u] - mt);
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        A o = 0;
        for (int u = 0; u < kWarps; ++u) o += wm[u] == -INFINITY ? A(0) : acc[u][d] * kv_exp(wm[u] - mt);
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
        const A s = dot_qk(qs, k, kbase, j, HS, lane);
        const A m_new = s > m ? s : m;
        l = (m == -INFINITY ? A(0) : l * kv_exp(m - m_new)) + kv_exp(s - m_new);
        m = m_new;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
    __syncthreads();
    A mt = -INFINITY;
    for (int u = 0; u < kWarps; ++u) mt = wm[u] > mt ? wm[u] : mt;
    A lt = 0;
    for (int u = 0; u < kWarps; ++u) lt += wm[u] == -INFINITY ? A(0) : wl[u] * kv_exp(wm[u] - mt);
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
    long long n = w.numel();
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x)
        store_elem<float>(w.bytes() + elem_offset(w, e), w.dtype, 0.0f);
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
