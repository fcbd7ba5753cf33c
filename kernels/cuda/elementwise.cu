// Elementwise CUDA kernels (ADD, MUL, SCALE, SILU, SWIGLU, COPY, and the gradients
// SILU_BACKWARD, SWIGLU_BACKWARD, AXPY): one thread per element, strided and broadcast-aware,
// the formulas from kernels/common/element_math.h.
#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
// Byte offsets of linear element i in up to three views of one shape (d's, after broadcast_to):
// the index is split into coordinates once, with I-wide division (32-bit when the tensor is
// small enough: 64-bit division is a long instruction sequence on the GPU). Contiguous views
// skip the split. On an H200 the per-view elem_offset made elementwise ops 60% of a prefill's
// GPU time (docs/GPU.md).
struct Offsets3 {
    long long d, a, b;
};
template <class I>
__device__ __forceinline__ Offsets3 offsets3(const TensorView& d, const TensorView& a, const TensorView& b, I i, bool contig) {
    if (contig) return {(long long)i * dtype_size(d.dtype), (long long)i * dtype_size(a.dtype), (long long)i * dtype_size(b.dtype)};
    Offsets3 o{0, 0, 0};
#pragma unroll
    for (int k = KV_MAX_DIMS - 1; k >= 0; --k) {  // unrolled: see elem_offset
        if (k >= d.ndim) continue;
        const I n = I(d.ne[k]);
        const I idx = i % n;
        i /= n;
        o.d += (long long)idx * d.nb[k];
        o.a += (long long)idx * a.nb[k];
        o.b += (long long)idx * b.nb[k];
    }
    return o;
}

template <class A, class I>
__global__ void elementwise_kernel(OpKind op, float alpha, TensorView d, TensorView a, TensorView b, int nsrc, bool contig) {
    const I n = I(dev_numel(d));
    for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < n; i += I(gridDim.x) * I(blockDim.x)) {
        const Offsets3 o = offsets3<I>(d, a, b, i, contig);
        A x = load_elem<A>(a.bytes() + o.a, a.dtype);
        A y = nsrc > 1 ? load_elem<A>(b.bytes() + o.b, b.dtype) : A(0);
        A r;
        switch (op) {
            case OpKind::ADD: r = x + y; break;
            case OpKind::MUL: r = x * y; break;
            case OpKind::SCALE: r = A(alpha) * x; break;
            case OpKind::SILU: r = kv_silu(x); break;
            case OpKind::SWIGLU: r = kv_silu(x) * y; break;
            default: r = x; break;  // COPY
        }
        store_elem<A>(d.bytes() + o.d, d.dtype, r);
    }
}

template <class A>
void launch_elementwise(const OpContext& ctx, const OpCall& c, const TensorView& d, const TensorView& a, const TensorView& b,
                        unsigned blocks, int threads) {
    // Broadcast sources have zero strides and are never contiguous: they take the split path.
    const bool contig = d.is_contiguous() && a.is_contiguous() && (c.nsrc < 2 || b.is_contiguous());
    if (d.numel() < (1LL << 31))
        elementwise_kernel<A, unsigned><<<blocks, threads, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, a, b, c.nsrc, contig);
    else
        elementwise_kernel<A, long long><<<blocks, threads, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, a, b, c.nsrc, contig);
}

// d (and d2) from up to three sources; acc1/acc2: add into the existing outputs. Offsets as in
// elementwise_kernel: one split of the index for all five views, or none when all are contiguous.
template <class A, class I>
__global__ void grad_elementwise_kernel(OpKind op, float alpha, TensorView d, TensorView d2, TensorView a, TensorView b,
                                        TensorView g, int acc1, int acc2, bool contig) {
    const I n = I(dev_numel(d));
    for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < n; i += I(gridDim.x) * I(blockDim.x)) {
        const Offsets3 o = offsets3<I>(d, a, b, i, contig);
        const Offsets3 o2 = offsets3<I>(d2, g, g, i, contig);
        char* dp = d.bytes() + o.d;
        const A x = load_elem<A>(a.bytes() + o.a, a.dtype);
        A r1 = acc1 ? load_elem<A>(dp, d.dtype) : A(0);
        if (op == OpKind::AXPY) {
            r1 += A(alpha) * x;
        } else if (op == OpKind::SILU_BACKWARD) {
            r1 += load_elem<A>(b.bytes() + o.b, b.dtype) * kv_silu_grad(x);
        } else {  // SWIGLU_BACKWARD: a gate, b up, g dy
            char* d2p = d2.bytes() + o2.d;
            A dg, du;
            kv_swiglu_grad(x, load_elem<A>(b.bytes() + o.b, b.dtype), load_elem<A>(g.bytes() + o2.a, g.dtype), &dg, &du);
            r1 += dg;
            store_elem<A>(d2p, d2.dtype, (acc2 ? load_elem<A>(d2p, d2.dtype) : A(0)) + du);
        }
        store_elem<A>(dp, d.dtype, r1);
    }
}

__global__ void zero_view_kernel(TensorView v) {
    long long n = dev_numel(v);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store_elem<double>(v.bytes() + elem_offset(v, i), v.dtype, 0.0);
}

__global__ void copy_int_kernel(TensorView d, TensorView a) {
    long long n = dev_numel(d);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long v = load_elem<long long>(a.bytes() + elem_offset(a, i), a.dtype);
        store_elem<long long>(d.bytes() + elem_offset(d, i), d.dtype, v);
    }
}
}  // namespace

void elementwise_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    TensorView a = broadcast_to(c.src[0], d);
    TensorView b = c.nsrc > 1 ? broadcast_to(c.src[1], d) : a;
    const int threads = 256;
    unsigned blocks = blocks_for(d.numel(), threads);
    if (c.op == OpKind::COPY && dtype_is_int(d.dtype) && dtype_is_int(a.dtype)) {
        copy_int_kernel<<<blocks, threads, 0, stream_of(ctx)>>>(d, a);
    } else if (is_f64_call(c) || (c.op == OpKind::COPY && (dtype_is_int(d.dtype) || dtype_is_int(a.dtype)))) {
        launch_elementwise<double>(ctx, c, d, a, b, blocks, threads);
    } else {
        launch_elementwise<float>(ctx, c, d, a, b, blocks, threads);
    }
    KV_CUDA_CHECK_LAUNCH();
}

void elementwise_backward(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    if (d.numel() == 0) return;
    TensorView a = broadcast_to(c.src[0], d);
    TensorView b = c.nsrc > 1 ? broadcast_to(c.src[1], d) : a;
    TensorView g = c.nsrc > 2 ? broadcast_to(c.src[2], d) : a;
    TensorView d2 = c.dst2.data ? c.dst2 : d;
    const int acc1 = c.op == OpKind::AXPY || (c.p.accumulate & KV_ACC_DST), acc2 = (c.p.accumulate & KV_ACC_DST2) != 0;
    unsigned blocks = blocks_for(d.numel(), 256);
    const bool contig = d.is_contiguous() && d2.is_contiguous() && a.is_contiguous() && b.is_contiguous() && g.is_contiguous();
    const bool small = d.numel() < (1LL << 31);
    cudaStream_t st = stream_of(ctx);
    if (is_f64_call(c)) {
        if (small) grad_elementwise_kernel<double, unsigned><<<blocks, 256, 0, st>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2, contig);
        else grad_elementwise_kernel<double, long long><<<blocks, 256, 0, st>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2, contig);
    } else {
        if (small) grad_elementwise_kernel<float, unsigned><<<blocks, 256, 0, st>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2, contig);
        else grad_elementwise_kernel<float, long long><<<blocks, 256, 0, st>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2, contig);
    }
    KV_CUDA_CHECK_LAUNCH();
}

void zero_view(const OpContext& ctx, const TensorView& v) {
    if (v.numel() == 0) return;
    zero_view_kernel<<<blocks_for(v.numel(), 256), 256, 0, stream_of(ctx)>>>(v);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
