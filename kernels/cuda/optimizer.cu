// OPTIMIZER_STEP on CUDA: one thread per element running kv_optim_update from
// kernels/common/optim_math.h, the same per-element code as the CPU kernel; step constants
// (bias corrections) are derived once on the host.
#include "cuda_common.cuh"
#include "kernels/common/optim_math.h"

namespace kv::cuda {

namespace {
template <class A>
__global__ void optimizer_kernel(OptimConsts<A> k, TensorView p, TensorView g, TensorView s1, TensorView s2, int has1, int has2) {
    const long long n = dev_numel(p);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        char* pp = p.bytes() + elem_offset(p, i);
        char* p1 = has1 ? s1.bytes() + elem_offset(s1, i) : nullptr;
        char* p2 = has2 ? s2.bytes() + elem_offset(s2, i) : nullptr;
        A theta = load_elem<A>(pp, p.dtype);
        A a = has1 ? load_elem<A>(p1, s1.dtype) : A(0);
        A b = has2 ? load_elem<A>(p2, s2.dtype) : A(0);
        kv_optim_update(k, &theta, load_elem<A>(g.bytes() + elem_offset(g, i), g.dtype), &a, &b);
        store_elem<A>(pp, p.dtype, theta);
        if (has1) store_elem<A>(p1, s1.dtype, a);
        if (has2) store_elem<A>(p2, s2.dtype, b);
    }
}
}  // namespace

void optimizer_step(const OpContext& ctx, const OpCall& c) {
    const long long n = c.dst.numel();
    if (!n) return;
    const int has1 = c.dst2.data != nullptr, has2 = c.dst3.data != nullptr;
    const TensorView g = broadcast_to(c.src[0], c.dst);
    const TensorView s1 = has1 ? c.dst2 : c.dst, s2 = has2 ? c.dst3 : c.dst;
    unsigned blocks = blocks_for(n, 256);
    if (is_f64_call(c))
        optimizer_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(optim_consts<double>(c.p.opt), c.dst, g, s1, s2, has1, has2);
    else
        optimizer_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(optim_consts<float>(c.p.opt), c.dst, g, s1, s2, has1, has2);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
