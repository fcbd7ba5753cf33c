// Row-wise CUDA kernels over the last dimension: RMSNORM (and its gradient), SOFTMAX,
// SUM/MAX/NORM, and the whole-tensor GRAD_NORM_SQ. One block per row; block-wide reductions
// through shared memory. The RMSNorm gradient runs as row statistics, dweight by columns (rows
// in order, deterministic), then dx, so dx may overwrite dy.
#include <cfloat>

#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
constexpr int kThreads = 256;

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
    long long r = blockIdx.x, n = last_ne(x);
    const char* xr = x.bytes() + row_offset(x, r);
    char* dr = d.bytes() + row_offset(d, r);
    long long xs = last_nb(x), ds = last_nb(d);
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
    long long r = blockIdx.x, n = last_ne(x);
    const char* xr = x.bytes() + row_offset(x, r);
    char* dr = d.bytes() + row_offset(d, r);
    long long xs = last_nb(x), ds = last_nb(d);
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
    long long r = blockIdx.x, n = last_ne(x);
    const char* xr = x.bytes() + row_offset(x, r);
    long long xs = last_nb(x);
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

// Per row: rinv = rms_inv(x) and k = rinv^3 mean(dy w' x)  (stats[2 r], stats[2 r + 1]).
template <class A>
__global__ void rmsnorm_stats_kernel(TensorView x, TensorView dy, TensorView w, int has_w, float eps, float offset, A* stats) {
    __shared__ A sh[kThreads];
    const long long r = blockIdx.x, n = last_ne(x);
    const char* xr = x.bytes() + row_offset(x, r);
    const char* gr = dy.bytes() + row_offset(dy, r);
    const long long xs = last_nb(x), gs = last_nb(dy);
    A ss = 0, gx = 0;
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        const A v = load_elem<A>(xr + i * xs, x.dtype);
        A wv = A(1);
        if (has_w) wv = A(offset) + load_elem<A>(w.bytes() + i * w.nb[0], w.dtype);
        ss += v * v;
        gx += load_elem<A>(gr + i * gs, dy.dtype) * wv * v;
    }
    ss = block_sum(ss, sh);
    gx = block_sum(gx, sh);
    if (threadIdx.x == 0) {
        const A rr = kv_rms_inv(ss, n, A(eps));
        stats[2 * r] = rr;
        stats[2 * r + 1] = rr * rr * rr * gx / A(n);
    }
}

// dweight[c] (+)= sum over rows of dy x rinv: one thread per column.
template <class A>
__global__ void rmsnorm_dweight_kernel(TensorView x, TensorView dy, TensorView dw, const A* stats, long long rows, int acc) {
    const long long n = last_ne(x);
    const long long xs = last_nb(x), gs = last_nb(dy);
    for (long long col = blockIdx.x * (long long)blockDim.x + threadIdx.x; col < n; col += (long long)gridDim.x * blockDim.x) {
        A sum = 0;
        for (long long r = 0; r < rows; ++r)
            sum += load_elem<A>(dy.bytes() + row_offset(dy, r) + col * gs, dy.dtype) * load_elem<A>(x.bytes() + row_offset(x, r) + col * xs, x.dtype) *
                   stats[2 * r];
        char* p = dw.bytes() + col * dw.nb[0];
        store_elem<A>(p, dw.dtype, (acc ? load_elem<A>(p, dw.dtype) : A(0)) + sum);
    }
}

template <class A>
__global__ void rmsnorm_dx_kernel(TensorView dx, TensorView x, TensorView dy, TensorView w, int has_w, float offset, const A* stats,
                                  int acc) {
    const long long r = blockIdx.x, n = last_ne(x);
    const char* xr = x.bytes() + row_offset(x, r);
    const char* gr = dy.bytes() + row_offset(dy, r);
    char* dr = dx.bytes() + row_offset(dx, r);
    const long long xs = last_nb(x), gs = last_nb(dy), ds = last_nb(dx);
    const A rr = stats[2 * r], k = stats[2 * r + 1];
    for (long long i = threadIdx.x; i < n; i += blockDim.x) {
        A wv = A(1);
        if (has_w) wv = A(offset) + load_elem<A>(w.bytes() + i * w.nb[0], w.dtype);
        A v = kv_rmsnorm_dx(load_elem<A>(gr + i * gs, dy.dtype) * wv, load_elem<A>(xr + i * xs, x.dtype), rr, k);
        if (acc) v += load_elem<A>(dr + i * ds, dx.dtype);
        store_elem<A>(dr + i * ds, dx.dtype, v);
    }
}

// Whole-tensor sum of squares in f64: per-block partials added atomically into *out.
__global__ void sum_squares_kernel(TensorView x, double* out) {
    __shared__ double sh[kThreads];
    const long long n = dev_numel(x);
    double acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const double v = load_elem<double>(x.bytes() + elem_offset(x, i), x.dtype);
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) atomicAdd(out, acc);
}

__global__ void finish_norm_kernel(TensorView d, const double* total, int acc) {
    double v = *total;
    if (acc) v += load_elem<double>(d.bytes(), d.dtype);
    store_elem<double>(d.bytes(), d.dtype, v);
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

template <class A>
void rmsnorm_backward_run(const OpContext& ctx, const OpCall& c, unsigned rows) {
    const bool has_w = c.nsrc > 2 && c.src[2].data;
    TensorView w = has_w ? c.src[2] : c.src[0];
    DeviceScratch stats(ctx, sizeof(A) * 2 * size_t(rows));
    cudaStream_t st = stream_of(ctx);
    rmsnorm_stats_kernel<A><<<rows, kThreads, 0, st>>>(c.src[0], c.src[1], w, has_w, c.p.eps, c.p.weight_offset, stats.as<A>());
    KV_CUDA_CHECK_LAUNCH();
    if (c.dst2.data) {
        const long long n = c.src[0].ne[c.src[0].ndim - 1];
        rmsnorm_dweight_kernel<A><<<blocks_for(n, kThreads), kThreads, 0, st>>>(c.src[0], c.src[1], c.dst2, stats.as<A>(), rows,
                                                                             (c.p.accumulate & KV_ACC_DST2) != 0);
        KV_CUDA_CHECK_LAUNCH();
    }
    rmsnorm_dx_kernel<A><<<rows, kThreads, 0, st>>>(c.dst, c.src[0], c.src[1], w, has_w, c.p.weight_offset, stats.as<A>(),
                                                    (c.p.accumulate & KV_ACC_DST) != 0);
    KV_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const OpContext& ctx, const OpCall& c) {
    unsigned rows = rows_of(c.src[0]);
    if (!rows) {
        if (c.dst2.data && !(c.p.accumulate & KV_ACC_DST2)) zero_view(ctx, c.dst2);
        return;
    }
    if (is_f64_call(c)) rmsnorm_backward_run<double>(ctx, c, rows);
    else rmsnorm_backward_run<float>(ctx, c, rows);
}

void grad_norm_sq_forward(const OpContext& ctx, const OpCall& c) {
    DeviceScratch total(ctx, sizeof(double));
    cudaStream_t st = stream_of(ctx);
    KV_CUDA_CHECK(cudaMemsetAsync(total.as<double>(), 0, sizeof(double), st));
    if (c.src[0].numel() > 0) {
        sum_squares_kernel<<<blocks_for(c.src[0].numel(), kThreads), kThreads, 0, st>>>(c.src[0], total.as<double>());
        KV_CUDA_CHECK_LAUNCH();
    }
    finish_norm_kernel<<<1, 1, 0, st>>>(c.dst, total.as<double>(), (c.p.accumulate & KV_ACC_DST) != 0);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
