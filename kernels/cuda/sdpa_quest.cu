// SDPA_QUEST on CUDA: one block per (query, head, batch row). The block bounds every visible
// page with the element math the CPU kernel and the engine share (kernels/common/quest_math.h),
// ranks the bounds in shared memory (a page is chosen when fewer than `pages` pages come
// before it in quest_before order, or when it is the query's own page), then its warps stride
// over the chosen pages' slots with an online softmax (the layout of sdpa_kivi.cu). A first,
// simple kernel: correctness, not speed (the ranking is quadratic in the visible pages).
#include "cuda_common.cuh"
#include "kernels/common/online_softmax.h"
#include "kernels/common/quest_math.h"

namespace kv::cuda {

namespace {

constexpr int kQuestWarps = 4;
constexpr int kQuestMaxHS = 256;
constexpr long long kQuestSharedBytes = 40 << 10;  // page bounds + flags in shared memory

struct QuestArgs {
    TensorView y, q, k, v, kpos, qpos, kmin, kmax, w, sel;
    int P, pages, weights;
    float alpha;
};

template <class A>
__device__ A quest_warp_total(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

template <class A>
__global__ void sdpa_quest_kernel(QuestArgs a) {
    __shared__ A qs[kQuestMaxHS];
    __shared__ A acc[kQuestWarps][kQuestMaxHS];
    __shared__ A wm[kQuestWarps], wl[kQuestWarps];
    __shared__ int nv_s;
    extern __shared__ unsigned char dyn[];
    const long long i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const long long NH = a.q.ne[1], HS = a.q.ne[3], G = a.k.ne[1], T = a.k.ne[2], R = NH / G, g = h / R;
    const long long NP = (T + a.P - 1) / a.P;
    A* ub = reinterpret_cast<A*>(dyn);
    unsigned char* chosen = dyn + NP * sizeof(A);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (long long d = threadIdx.x; d < HS; d += blockDim.x)
        qs[d] = load_elem<A>(a.q.bytes() + b * a.q.nb[0] + h * a.q.nb[1] + i * a.q.nb[2] + d * a.q.nb[3], a.q.dtype);
    for (long long d = lane; d < HS; d += 32) acc[warp][d] = 0;
    if (threadIdx.x == 0) nv_s = 0;
    __syncthreads();
    const int qp = *reinterpret_cast<const int*>(a.qpos.bytes() + (a.qpos.ne[0] == 1 ? 0 : b) * a.qpos.nb[0] + i * a.qpos.nb[1]);
    const char* kp_base = a.kpos.bytes() + (a.kpos.ne[0] == 1 ? 0 : b) * a.kpos.nb[0] + (a.kpos.ne[1] == 1 ? 0 : g) * a.kpos.nb[1];
    // Visible pages (positions are nondecreasing, so they are a prefix): count them.
    for (long long j = threadIdx.x; j < NP; j += blockDim.x)
        if (*reinterpret_cast<const int*>(kp_base + j * a.P * a.kpos.nb[2]) <= qp) atomicAdd(&nv_s, 1);
    __syncthreads();
    const long long nv = nv_s;
    // Bounds of the unscaled query, one warp per page.
    const char* mnb = a.kmin.bytes() + b * a.kmin.nb[0] + g * a.kmin.nb[1];
    const char* mxb = a.kmax.bytes() + b * a.kmax.nb[0] + g * a.kmax.nb[1];
    for (long long j = warp; j < nv; j += kQuestWarps) {
        A part = 0;
        for (long long d = lane; d < HS; d += 32) {
            const A lo = qs[d] * A(*reinterpret_cast<const float*>(mnb + j * a.kmin.nb[2] + d * 4));
            const A hi = qs[d] * A(*reinterpret_cast<const float*>(mxb + j * a.kmax.nb[2] + d * 4));
            part += lo > hi ? lo : hi;
        }
        const A u = quest_warp_total(part);
        if (lane == 0) ub[j] = u;
    }
    __syncthreads();
    for (long long j = threadIdx.x; j < NP; j += blockDim.x) {
        int c = 0;
        if (j < nv) {
            long long rank = 0;
            if (a.pages < nv)
                for (long long o = 0; o < nv && rank < a.pages; ++o) rank += quest_before<A>(ub[o], o, ub[j], j) ? 1 : 0;
            c = rank < a.pages || j == nv - 1;
        }
        chosen[j] = (unsigned char)c;
    }
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) qs[d] *= A(a.alpha);
    __syncthreads();
    if (a.sel.data && threadIdx.x == 0) {
        long long e = 0;
        char* row = a.sel.bytes() + b * a.sel.nb[0] + h * a.sel.nb[1] + i * a.sel.nb[2];
        for (long long j = 0; j < NP && e <= a.pages; ++j)
            if (chosen[j]) *reinterpret_cast<int*>(row + (e++) * a.sel.nb[3]) = int(j);
        for (; e <= a.pages; ++e) *reinterpret_cast<int*>(row + e * a.sel.nb[3]) = -1;
    }
    const char* kb = a.k.bytes() + b * a.k.nb[0] + g * a.k.nb[1];
    const char* vb = a.v.bytes() + b * a.v.nb[0] + g * a.v.nb[1];
    A m = -INFINITY, l = 0;
    for (long long j = warp; j < T; j += kQuestWarps) {
        if (!chosen[j / a.P]) continue;
        if (*reinterpret_cast<const int*>(kp_base + j * a.kpos.nb[2]) > qp) continue;
        A part = 0;
        for (long long d = lane; d < HS; d += 32) part += qs[d] * load_elem<A>(kb + j * a.k.nb[2] + d * a.k.nb[3], a.k.dtype);
        const SoftmaxStep<A> st = online_softmax_push(m, l, quest_warp_total(part));
        for (long long d = lane; d < HS; d += 32)
            acc[warp][d] = acc[warp][d] * st.corr + st.e * load_elem<A>(vb + j * a.v.nb[2] + d * a.v.nb[3], a.v.dtype);
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    A mt, lt;
    online_softmax_merge(wm, wl, kQuestWarps, mt, lt);
    for (long long d = threadIdx.x; d < HS; d += blockDim.x) {
        A o = 0;
        for (int u = 0; u < kQuestWarps; ++u) o += acc[u][d] * online_softmax_scale(wm[u], mt);
        store_elem<A>(a.y.bytes() + b * a.y.nb[0] + h * a.y.nb[1] + i * a.y.nb[2] + d * a.y.nb[3], a.y.dtype, lt > A(0) ? o / lt : A(0));
    }
    if (!a.weights || !(lt > A(0))) return;
    for (long long j = warp; j < T; j += kQuestWarps) {
        if (!chosen[j / a.P]) continue;
        if (*reinterpret_cast<const int*>(kp_base + j * a.kpos.nb[2]) > qp) continue;
        A part = 0;
        for (long long d = lane; d < HS; d += 32) part += qs[d] * load_elem<A>(kb + j * a.k.nb[2] + d * a.k.nb[3], a.k.dtype);
        const A s = quest_warp_total(part);
        if (lane == 0) atomicAdd(reinterpret_cast<A*>(a.w.bytes() + b * a.w.nb[0] + g * a.w.nb[1] + j * a.w.nb[2]), exp(s - mt) / lt / A(R));
    }
}

__global__ void quest_zero(TensorView w) {
    const long long n = w.ne[0] * w.ne[1] * w.ne[2];
    for (long long e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
        const long long j = e % w.ne[2], g = (e / w.ne[2]) % w.ne[1], b = e / (w.ne[2] * w.ne[1]);
        char* p = w.bytes() + b * w.nb[0] + g * w.nb[1] + j * w.nb[2];
        if (w.dtype == DType::F64) *reinterpret_cast<double*>(p) = 0;
        else *reinterpret_cast<float*>(p) = 0;
    }
}

}  // namespace

bool sdpa_quest_fits(const OpCall& c) {
    const long long NP = (c.src[1].ne[2] + c.p.quest_page - 1) / c.p.quest_page;
    return c.src[0].ne[3] <= kQuestMaxHS && NP * 9 <= kQuestSharedBytes;
}

void sdpa_quest_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    if (!sdpa_quest_fits(c)) throw KernelError("cuda sdpa_quest: head size above 256 or more pages than shared memory holds");
    if (q.numel() == 0) return;
    const bool f64 = is_f64_call(c);
    QuestArgs a{c.dst, q, c.src[1], c.src[2], c.src[3], c.src[4], c.src[5], c.src[6], c.dst2, c.dst3,
                c.p.quest_page, c.p.quest_pages, c.dst2.data != nullptr ? 1 : 0, c.p.alpha};
    if (a.weights) {
        if ((f64 && c.dst2.dtype != DType::F64) || (!f64 && c.dst2.dtype != DType::F32))
            throw KernelError("cuda sdpa_quest: weight sums must be f32 (f64 for f64 calls)");
        quest_zero<<<256, 256, 0, stream_of(ctx)>>>(c.dst2);
        KV_CUDA_CHECK_LAUNCH();
    }
    const long long NP = (c.src[1].ne[2] + c.p.quest_page - 1) / c.p.quest_page;
    dim3 grid(unsigned(q.ne[2]), unsigned(q.ne[1]), unsigned(q.ne[0]));
    if (f64) sdpa_quest_kernel<double><<<grid, 32 * kQuestWarps, size_t(NP * 9), stream_of(ctx)>>>(a);
    else sdpa_quest_kernel<float><<<grid, 32 * kQuestWarps, size_t(NP * 9), stream_of(ctx)>>>(a);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
