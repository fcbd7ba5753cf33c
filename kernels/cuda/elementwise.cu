// Elementwise CUDA kernels (ADD, MUL, SCALE, SILU, SWIGLU, COPY, and the gradients
// SILU_BACKWARD, SWIGLU_BACKWARD, AXPY): one thread per element, strided and broadcast-aware,
// the formulas from kernels/common/element_math.h.
#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
template <class A>
__global__ void elementwise_kernel(OpKind op, float alpha, TensorView d, TensorView a, TensorView b, int nsrc) {
    long long n = d.numel();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        A x = load_elem<A>(a.bytes() + elem_offset(a, i), a.dtype);
        A y = nsrc > 1 ? load_elem<A>(b.bytes() + elem_offset(b, i), b.dtype) : A(0);
        A r;
        switch (op) {
            case OpKind::ADD: r = x + y; break;
            case OpKind::MUL: r = x * y; break;
            case OpKind::SCALE: r = A(alpha) * x; break;
            case OpKind::SILU: r = kv_silu(x); break;
            case OpKind::SWIGLU: r = kv_silu(x) * y; break;
            default: r = x; break;  // COPY
        }
        store_elem<A>(d.bytes() + elem_offset(d, i), d.dtype, r);
    }
}

// d (and d2) from up to three sources; acc1/acc2: add into the existing outputs.
template <class A>
__global__ void grad_elementwise_kernel(OpKind op, float alpha, TensorView d, TensorView d2, TensorView a, TensorView b,
                                        TensorView g, int acc1, int acc2) {
    long long n = d.numel();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        char* dp = d.bytes() + elem_offset(d, i);
        const A x = load_elem<A>(a.bytes() + elem_offset(a, i), a.dtype);
        A r1 = acc1 ? load_elem<A>(dp, d.dtype) : A(0);
        if (op == OpKind::AXPY) {
            r1 += A(alpha) * x;
        } else if (op == OpKind::SILU_BACKWARD) {
            r1 += load_elem<A>(b.bytes() + elem_offset(b, i), b.dtype) * kv_silu_grad(x);
        } else {  // SWIGLU_BACKWARD: a gate, b up, g dy
            char* d2p = d2.bytes() + elem_offset(d2, i);
            A dg, du;
            kv_swiglu_grad(x, load_elem<A>(b.bytes() + elem_offset(b, i), b.dtype), load_elem<A>(g.bytes() + elem_offset(g, i), g.dtype),
                           &dg, &du);
            r1 += dg;
            store_elem<A>(d2p, d2.dtype, (acc2 ? load_elem<A>(d2p, d2.dtype) : A(0)) + du);
        }
        store_elem<A>(dp, d.dtype, r1);
    }
}

__global__ void zero_view_kernel(TensorView v) {
    long long n = v.numel();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        store_elem<double>(v.bytes() + elem_offset(v, i), v.dtype, 0.0);
}

__global__ void copy_int_kernel(TensorView d, TensorView a) {
    long long n = d.numel();
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
        elementwise_kernel<double><<<blocks, threads, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, a, b, c.nsrc);
    } else {
        elementwise_kernel<float><<<blocks, threads, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, a, b, c.nsrc);
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
    if (is_f64_call(c))
        grad_elementwise_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2);
    else
        grad_elementwise_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.op, c.p.alpha, d, d2, a, b, g, acc1, acc2);
    KV_CUDA_CHECK_LAUNCH();
}

void zero_view(const OpContext& ctx, const TensorView& v) {
    if (v.numel() == 0) return;
    zero_view_kernel<<<blocks_for(v.numel(), 256), 256, 0, stream_of(ctx)>>>(v);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
