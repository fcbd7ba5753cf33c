// Elementwise CUDA kernels (ADD, MUL, SCALE, SILU, SWIGLU, COPY): one thread per element,
// strided and broadcast-aware, the formulas from kernels/common/element_math.h.
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

}  // namespace kv::cuda
