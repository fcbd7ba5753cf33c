// Index-driven CUDA kernels: EMBEDDING, GATHER, SCATTER (one thread per moved element), and
// EMBEDDING_BACKWARD (atomic adds into an f32/f64 table: duplicate ids add up in an
// unspecified order, unlike the CPU's token order).
#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
template <class A>
__global__ void embedding_kernel(TensorView d, TensorView table, TensorView ids) {
    const long long C = table.ne[1], total = dev_numel(ids) * C;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long r = e / C, k = e % C;
        long long id = load_index(ids.bytes() + elem_offset(ids, r), ids.dtype);
        if (id < 0 || id >= table.ne[0]) id = 0;  // the engine validates ids; never read out of bounds
        A v = load_elem<A>(table.bytes() + id * table.nb[0] + k * table.nb[1], table.dtype);
        store_elem<A>(d.bytes() + elem_offset(d, e), d.dtype, v);
    }
}

template <class A>
__global__ void embedding_backward_kernel(TensorView dt, TensorView dy, TensorView ids) {
    const long long C = dt.ne[1], total = dev_numel(ids) * C;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long r = e / C, k = e % C;
        long long id = load_index(ids.bytes() + elem_offset(ids, r), ids.dtype);
        if (id < 0 || id >= dt.ne[0]) continue;  // the engine validates ids; never write out of bounds
        const A g = load_elem<A>(dy.bytes() + elem_offset(dy, e), dy.dtype);
        atomic_add_elem<A>(dt.bytes() + id * dt.nb[0] + k * dt.nb[1], dt.dtype, g);
    }
}

// it: iterated tensor; other: indexed along `ax`. gather reads other, scatter writes it.
template <class A>
__global__ void index_kernel(TensorView it, TensorView other, TensorView ix, int ax, int gather) {
    long long n = dev_numel(it);
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n; e += (long long)gridDim.x * blockDim.x) {
        long long rem = e, it_off = 0, ix_off = 0, ot_off = 0, ax_ne = 0, ax_nb = 0;
#pragma unroll
        for (int k = KV_MAX_DIMS - 1; k >= 0; --k) {  // unrolled: see elem_offset
            if (k >= it.ndim) continue;
            long long idx = rem % it.ne[k];
            rem /= it.ne[k];
            it_off += idx * it.nb[k];
            ix_off += idx * ix.nb[k];
            if (k != ax) ot_off += idx * other.nb[k];
            else ax_ne = other.ne[k], ax_nb = other.nb[k];
        }
        long long id = load_index(ix.bytes() + ix_off, ix.dtype);
        if (id < 0 || id >= ax_ne) continue;
        ot_off += id * ax_nb;
        if (gather) store_elem<A>(it.bytes() + it_off, it.dtype, load_elem<A>(other.bytes() + ot_off, other.dtype));
        else store_elem<A>(other.bytes() + ot_off, other.dtype, load_elem<A>(it.bytes() + it_off, it.dtype));
    }
}
}  // namespace

void embedding_forward(const OpContext& ctx, const OpCall& c) {
    long long n = c.dst.numel();
    if (!n) return;
    unsigned blocks = blocks_for(n, 256);
    if (is_f64_call(c)) embedding_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1]);
    else embedding_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1]);
    KV_CUDA_CHECK_LAUNCH();
}

void gather_forward(const OpContext& ctx, const OpCall& c) {
    long long n = c.dst.numel();
    if (!n) return;
    TensorView ix = broadcast_to(c.src[1], c.dst);
    unsigned blocks = blocks_for(n, 256);
    bool wide = is_f64_call(c) || dtype_is_int(c.dst.dtype);
    if (wide) index_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], ix, c.p.axis, 1);
    else index_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], ix, c.p.axis, 1);
    KV_CUDA_CHECK_LAUNCH();
}

void scatter_forward(const OpContext& ctx, const OpCall& c) {
    long long n = c.src[0].numel();
    if (!n) return;
    TensorView ix = broadcast_to(c.src[1], c.src[0]);
    unsigned blocks = blocks_for(n, 256);
    bool wide = is_f64_call(c) || dtype_is_int(c.dst.dtype);
    if (wide) index_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.src[0], c.dst, ix, c.p.axis, 0);
    else index_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.src[0], c.dst, ix, c.p.axis, 0);
    KV_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const OpContext& ctx, const OpCall& c) {
    if (!(c.p.accumulate & KV_ACC_DST)) zero_view(ctx, c.dst);
    long long n = c.src[0].numel();
    if (!n) return;
    unsigned blocks = blocks_for(n, 256);
    if (is_f64_call(c)) embedding_backward_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1]);
    else embedding_backward_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1]);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
