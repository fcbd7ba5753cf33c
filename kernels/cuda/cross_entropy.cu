// CROSS_ENTROPY and CROSS_ENTROPY_BACKWARD on CUDA: one block per logit row; max and sum of
// exponentials through shared-memory reductions (log-sum-exp with the max subtracted), then
// the loss (thread 0) or the gradient row (all threads). Same semantics as the CPU kernel.
#include <cfloat>

#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
constexpr int kThreads = 256;


template <class A>
__device__ A ce_block_reduce(A v, A* sh, bool is_max) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] = is_max ? (sh[threadIdx.x] > sh[threadIdx.x + s] ? sh[threadIdx.x] : sh[threadIdx.x + s])
                                                      : sh[threadIdx.x] + sh[threadIdx.x + s];
        __syncthreads();
    }
    A r = sh[0];
    __syncthreads();
    return r;
}

// z_k = logits[r, cols[k]] (cols absent: k itself).
template <class A>
__device__ __forceinline__ A ce_z(const char* row, long long ls, DType dt, const TensorView& cols, int has_cols, long long k) {
    const long long col = has_cols ? load_index(cols.bytes() + elem_offset(cols, k), cols.dtype) : k;
    return load_elem<A>(row + col * ls, dt);
}

template <class A>
__global__ void cross_entropy_kernel(TensorView d, TensorView logits, TensorView targets, TensorView cols, int has_cols,
                                     TensorView dloss, int has_dloss, int backward, float alpha, int ignore_index, int acc) {
    __shared__ A sh[kThreads];
    const long long r = blockIdx.x, V = last_ne(logits);
    const long long K = has_cols ? dev_numel(cols) : V;
    const char* row = logits.bytes() + row_offset(logits, r);
    const long long ls = last_nb(logits);
    const long long t = load_index(targets.bytes() + elem_offset(targets, r), targets.dtype);
    const bool ignored = t == ignore_index;
    A m = -INFINITY;
    for (long long k = threadIdx.x; k < K; k += blockDim.x) {
        const A z = ce_z<A>(row, ls, logits.dtype, cols, has_cols, k);
        m = z > m ? z : m;
    }
    m = ce_block_reduce(m, sh, true);
    A s = 0;
    for (long long k = threadIdx.x; k < K; k += blockDim.x) s += kv_exp(ce_z<A>(row, ls, logits.dtype, cols, has_cols, k) - m);
    s = ce_block_reduce(s, sh, false);
    if (!backward) {
        if (threadIdx.x == 0) {
            A loss = A(0);
            if (!ignored) loss = (t >= 0 && t < K) ? m + log(s) - ce_z<A>(row, ls, logits.dtype, cols, has_cols, t) : A(NAN);
            store_elem<A>(d.bytes() + elem_offset(d, r), d.dtype, loss);
        }
        return;
    }
    char* drow = d.bytes() + row_offset(d, r);
    const long long dsz = last_nb(d);
    if (!acc)
        for (long long j = threadIdx.x; j < V; j += blockDim.x) store_elem<A>(drow + j * dsz, d.dtype, A(0));
    if (ignored) return;
    __syncthreads();  // zeros before the subset columns are added
    A scale = A(alpha);
    if (has_dloss) scale *= load_elem<A>(dloss.bytes() + elem_offset(dloss, r), dloss.dtype);
    for (long long k = threadIdx.x; k < K; k += blockDim.x) {
        const long long col = has_cols ? load_index(cols.bytes() + elem_offset(cols, k), cols.dtype) : k;
        const A g = kv_exp(load_elem<A>(row + col * ls, logits.dtype) - m) * scale / s - (k == t ? scale : A(0));
        char* p = drow + col * dsz;
        store_elem<A>(p, d.dtype, load_elem<A>(p, d.dtype) + g);
    }
}

template <class A>
void launch(const OpContext& ctx, const OpCall& c, int backward) {
    const TensorView& logits = c.src[0];
    const long long V = logits.ne[logits.ndim - 1];
    const unsigned rows = unsigned(V ? logits.numel() / V : 0);
    if (!rows) return;
    const int has_cols = c.nsrc > 2 && c.src[2].data != nullptr;
    const int has_dloss = backward && c.nsrc > 3 && c.src[3].data != nullptr;
    cross_entropy_kernel<A><<<rows, kThreads, 0, stream_of(ctx)>>>(c.dst, logits, c.src[1], has_cols ? c.src[2] : c.src[1], has_cols,
                                                                   has_dloss ? c.src[3] : c.src[0], has_dloss, backward, c.p.alpha,
                                                                   c.p.ignore_index, (c.p.accumulate & KV_ACC_DST) != 0);
    KV_CUDA_CHECK_LAUNCH();
}
}  // namespace

void cross_entropy_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) launch<double>(ctx, c, 0);
    else launch<float>(ctx, c, 0);
}

void cross_entropy_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) launch<double>(ctx, c, 1);
    else launch<float>(ctx, c, 1);
}

}  // namespace kv::cuda
