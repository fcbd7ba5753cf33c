// Row-wise CUDA kernels over the last dimension: RMSNORM, SOFTMAX, SUM/MAX/NORM.
// One block per row; block-wide reductions through shared memory.
#include <cfloat>

#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
constexpr int kThreads = 256;

// Offset of row r (row-major over all but the last dim).
__device__ __forceinline__ long long row_off(const TensorView& v, long long r) {
    long long off = 0;
    for (int k = v.ndim - 2; k >= 0; --k) {
        off += (r % v.ne[k]) * v.nb[k];
        r /= v.ne[k];
    }
    return off;
}

template <class A>
__device__ A block_sum(A v, A* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

template <class A>
__device__ A block_max(A v, A* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = sh[threadIdx.x] > sh[threadIdx.x + s] ? sh[threadIdx.x] : sh[threadIdx.x + s];
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

template <class A>
__global__ void rmsnorm_kernel(TensorView d, TensorView x, TensorView w, int has_w, float eps, float offset) {
    __shared__ A sh[kThreads];
    long long r = blockIdx.x, n = x.ne[x.ndim - 1];
    const char* xr = x.bytes() + row_off(x, r);
    char* dr = d.bytes() + row_off(d, r);
    long long xs = x.nb[x.ndim - 1], ds = d.nb[d.ndim - 1];
    A ss = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A v = load_elem<A>(xr + i * xs, x.dtype);
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    A inv = kv_rms_inv(ss, n, A(eps));
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A v = load_elem<A>(xr + i * xs, x.dtype) * inv;
        if (has_w) v *= A(offset) + load_elem<A>(w.bytes() + i * w.nb[0], w.dtype);
        store_elem<A>(dr + i * ds, d.dtype, v);
    }
}

template <class A>
__global__ void softmax_kernel(TensorView d, TensorView x, float alpha) {
    __shared__ A sh[kThreads];
    long long r = blockIdx.x, n = x.ne[x.ndim - 1];
    const char* xr = x.bytes() + row_off(x, r);
    char* dr = d.bytes() + row_off(d, r);
    long long xs = x.nb[x.ndim - 1], ds = d.nb[d.ndim - 1];
    A m = -INFINITY;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A v = A(alpha) * load_elem<A>(xr + i * xs, x.dtype);
        m = v > m ? v : m;
    }
    m = block_max(m, sh);
    A s = 0;
    if (m != -INFINITY)
        for (long long i = threadIdx.x; i < n; i += blockDim.x) s += kv_exp(A(alpha) * load_elem<A>(xr + i * xs, x.dtype) - m);
    s = block_sum(s, sh);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A v = m == -INFINITY ? A(0) : kv_exp(A(alpha) * load_elem<A>(xr + i * xs, x.dtype) - m) / s;
        store_elem<A>(dr + i * ds, d.dtype, v);
    }
}

template <class A>
__global__ void reduce_kernel(OpKind op, TensorView d, TensorView x) {
    __shared__ A sh[kThreads];
    long long r = blockIdx.x, n = x.ne[x.ndim - 1];
    const char* xr = x.bytes() + row_off(x, r);
    long long xs = x.nb[x.ndim - 1];
    A acc = op == OpKind::MAX ? A(-INFINITY) : A(0);
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A v = load_elem<A>(xr + i * xs, x.dtype);
        if (op == OpKind::MAX) acc = v > acc ? v : acc;
        else acc += op == OpKind::NORM ? v * v : v;
    }
    acc = op == OpKind::MAX ? block_max(acc, sh) : block_sum(acc, sh);
    if (threadIdx.x == 0) {
        if (op == OpKind::NORM) acc = kv_sqrt(acc);
        store_elem<A>(d.bytes() + elem_offset(d, r), d.dtype, acc);
    }
}

unsigned rows_of(const TensorView& v) {
    long long n = v.ndim ? v.ne[v.ndim - 1] : 1;
    return unsigned(n ? v.numel() / n : 0);
}
}  // namespace

void rmsnorm_forward(const OpContext& ctx, const OpCall& c) {
    unsigned rows = rows_of(c.src[0]);
    if (!rows) return;
    TensorView w = c.nsrc > 1 ? c.src[1] : c.src[0];
    if (is_f64_call(c))
        rmsnorm_kernel<double><<<rows, kThreads, 0, stream_of(ctx)>>>(c.dst, c.src[0], w, c.nsrc > 1, c.p.eps, c.p.weight_offset);
    else
        rmsnorm_kernel<float><<<rows, kThreads, 0, stream_of(ctx)>>>(c.dst, c.src[0], w, c.nsrc > 1, c.p.eps, c.p.weight_offset);
    KV_CUDA_CHECK_LAUNCH();
}

void softmax_forward(const OpContext& ctx, const OpCall& c) {
    unsigned rows = rows_of(c.src[0]);
    if (!rows) return;
    if (is_f64_call(c)) softmax_kernel<double><<<rows, kThreads, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.p.alpha);
    else softmax_kernel<float><<<rows, kThreads, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.p.alpha);
    KV_CUDA_CHECK_LAUNCH();
}

void reduce_forward(const OpContext& ctx, const OpCall& c) {
    unsigned rows = rows_of(c.src[0]);
    if (!rows) return;
    if (is_f64_call(c)) reduce_kernel<double><<<rows, kThreads, 0, stream_of(ctx)>>>(c.op, c.dst, c.src[0]);
    else reduce_kernel<float><<<rows, kThreads, 0, stream_of(ctx)>>>(c.op, c.dst, c.src[0]);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
