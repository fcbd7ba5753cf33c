// SDPA_KIVI on CUDA: one block per (query, head, batch row), warps striding over the slots,
// each key and value decoded in registers by the element math the CPU kernel and the engine
// share (kernels/common/kivi_math.h) — the cache is never dequantized into a copy. A first,
// simple kernel (the layout of sdpa_kernel in sdpa.cu): correctness, not speed.
#include "cuda_common.cuh"
#include "kernels/common/online_softmax.h"
#include "kernels/common/kivi_math.h"

namespace kv::cuda {

namespace {

constexpr int kKiviWarps = 4;
constexpr int kKiviMaxHS = 256;

struct KiviArgs {
    TensorView y, q, kc, ks, vc, vs, res, map, kpos, qpos, w;
    int bits, S, window, weights;
    float alpha;
};

// Key (value) channel d of slot j of pair (b, g), decoded.
template <class A>
__device__ A kivi_k(const KiviArgs& a, long long b, long long g, long long j, long long d, int blk) {
    const long long grp = j / a.S, t = j % a.S;
    if (blk >= 0) return load_elem<A>(a.res.bytes() + blk * a.res.nb[0] + t * a.res.nb[2] + d * a.res.nb[3], a.res.dtype);
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(a.kc.bytes() + b * a.kc.nb[0] + g * a.kc.nb[1] + grp * a.kc.nb[2]);
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(a.ks.bytes() + b * a.ks.nb[0] + g * a.ks.nb[1] + grp * a.ks.nb[2]);
    return A(kivi_key_at(codes, sc, a.S, a.bits, t, d));
}
template <class A>
__device__ A kivi_v(const KiviArgs& a, long long b, long long g, long long j, long long d, int blk) {
    if (blk >= 0)
        return load_elem<A>(a.res.bytes() + blk * a.res.nb[0] + a.res.nb[1] + (j % a.S) * a.res.nb[2] + d * a.res.nb[3], a.res.dtype);
    const long long HS = a.q.ne[3], VG = HS / a.vs.ne[3];
    const uint8_t* codes = reinterpret_cast<const uint8_t*>(a.vc.bytes() + b * a.vc.nb[0] + g * a.vc.nb[1] + j * a.vc.nb[2]);
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(a.vs.bytes() + b * a.vs.nb[0] + g * a.vs.nb[1] + j * a.vs.nb[2]);
    return A(kivi_value_at(codes, sc, VG, a.bits, d));
}

template <class A>
__device__ A warp_total(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

template <class A>
__global__ void sdpa_kivi_kernel(KiviArgs a) {
    __shared__ A qs[kKiviMaxHS];
    __shared__ A acc[kKiviWarps][kKiviMaxHS];
    __shared__ A wm[kKiviWarps], wl[kKiviWarps];
    const long long i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const long long NH = a.q.ne[1], HS = a.q.ne[3], G = a.kc.ne[1], T = a.kpos.ne[2], R = NH / G, g = h / R;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long d = threadIdx.x; d < HS; d += blockDim.x)
        qs[d] = A(a.alpha) * load_elem<A>(a.q.bytes() + b * a.q.nb[0] + h * a.q.nb[1] + i * a.q.nb[2] + d * a.q.nb[3], a.q.dtype);
    for (long long d = lane; d < HS; d += 32) acc[warp][d] = 0;
    __syncthreads();
    const int qp = *reinterpret_cast<const int*>(a.qpos.bytes() + (a.qpos.ne[0] == 1 ? 0 : b) * a.qpos.nb[0] + i * a.qpos.nb[1]);
    const char* kp_base = a.kpos.bytes() + (a.kpos.ne[0] == 1 ? 0 : b) * a.kpos.nb[0] + (a.kpos.ne[1] == 1 ? 0 : g) * a.kpos.nb[1];
    const char* map_base = a.map.bytes() + b * a.map.nb[0] + g * a.map.nb[1];
    A m = -INFINITY, l = 0;
    for (long long j = warp; j < T; j += kKiviWarps) {
        const int p = *reinterpret_cast<const int*>(kp_base + j * a.kpos.nb[2]);
        if (p > qp || (a.window > 0 && p <= qp - a.window)) continue;
        const int blk = *reinterpret_cast<const int*>(map_base + (j / a.S) * a.map.nb[2]);
        A part = 0;
        for (long long d = lane; d < HS; d += 32) part += qs[d] * kivi_k<A>(a, b, g, j, d, blk);
        const SoftmaxStep<A> st = online_softmax_push(m, l, warp_total(part));
        for (long long d = lane; d < HS; d += 32) acc[warp][d] = acc[warp][d] * st.corr + st.e * kivi_v<A>(a, b, g, j, d, blk);
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    A mt, lt;
    online_softmax_merge(wm, wl, kKiviWarps, mt, lt);
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        A o = 0;
        for (int u = 0; u < kKiviWarps; ++u) o += acc[u][d] * online_softmax_scale(wm[u], mt);
        store_elem<A>(a.y.bytes() + b * a.y.nb[0] + h * a.y.nb[1] + i * a.y.nb[2] + d * a.y.nb[3], a.y.dtype, lt > A(0) ? o / lt : A(0));
    }
    if (!a.weights || !(lt > A(0))) return;
    for (long long j = warp; j < T; j += kKiviWarps) {
        const int p = *reinterpret_cast<const int*>(kp_base + j * a.kpos.nb[2]);
        if (p > qp || (a.window > 0 && p <= qp - a.window)) continue;
        const int blk = *reinterpret_cast<const int*>(map_base + (j / a.S) * a.map.nb[2]);
        A part = 0;
        for (long long d = lane; d < HS; d += 32) part += qs[d] * kivi_k<A>(a, b, g, j, d, blk);
        const A s = warp_total(part);
        if (lane == 0) atomicAdd(reinterpret_cast<A*>(a.w.bytes() + b * a.w.nb[0] + g * a.w.nb[1] + j * a.w.nb[2]), exp(s - mt) / lt / A(R));
    }
}

__global__ void kivi_zero(TensorView w) {
    const long long n = w.ne[0] * w.ne[1] * w.ne[2];
    for (long long e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const long long j = e % w.ne[2], g = (e / w.ne[2]) % w.ne[1], b = e / (w.ne[2] * w.ne[1]);
        char* p = w.bytes() + b * w.nb[0] + g * w.nb[1] + j * w.nb[2];
        if (w.dtype == DType::F64) *reinterpret_cast<double*>(p) = 0;
        else *reinterpret_cast<float*>(p) = 0;
    }
}

}  // namespace

void sdpa_kivi_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    if (q.ne[3] > kKiviMaxHS) throw KernelError("cuda sdpa_kivi: head size above 256 is not supported");
    if (c.nsrc > 9 && c.src[9].data)
        throw KernelError("cuda sdpa_kivi: attention sinks (source 9) are computed by the CPU backend only; run the model on the CPU");
    if (q.numel() == 0) return;
    const bool f64 = is_f64_call(c);
    KiviArgs a{c.dst, q, c.src[1], c.src[2], c.src[3], c.src[4], c.src[5], c.src[6], c.src[7], c.src[8], c.dst2,
               c.p.kivi_bits, c.p.kivi_group, c.p.window, c.dst2.data != nullptr ? 1 : 0, c.p.alpha};
    if (a.weights) {
        if ((f64 && c.dst2.dtype != DType::F64) || (!f64 && c.dst2.dtype != DType::F32))
            throw KernelError("cuda sdpa_kivi: weight sums must be f32 (f64 for f64 calls)");
        kivi_zero<<<256, 256, 0, stream_of(ctx)>>>(c.dst2);
        KV_CUDA_CHECK_LAUNCH();
    }
    dim3 grid(unsigned(q.ne[2]), unsigned(q.ne[1]), unsigned(q.ne[0]));
    if (f64) sdpa_kivi_kernel<double><<<grid, 32 * kKiviWarps, 0, stream_of(ctx)>>>(a);
    else sdpa_kivi_kernel<float><<<grid, 32 * kKiviWarps, 0, stream_of(ctx)>>>(a);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
