// Rotate-half RoPE on CUDA: one thread per (b, h, t, channel); pairs use kv_rope_pair from
// kernels/common/element_math.h, exactly like the CPU kernel.
#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
template <class A>
__global__ void rope_kernel(TensorView d, TensorView x, TensorView pos, TensorView cs, TensorView sn, int n_rot) {
    const long long B = x.ne[0], NH = x.ne[1], T = x.ne[2], HS = x.ne[3], half = n_rot / 2;
    long long total = B * NH * T * HS;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total; e += (long long)gridDim.x * blockDim.x) {
        long long i = e % HS, t = (e / HS) % T, h = (e / (HS * T)) % NH, b = e / (HS * T * NH);
        long long pb = pos.ne[0] == 1 ? 0 : b;
        int p = *reinterpret_cast<const int*>(pos.bytes() + pb * pos.nb[0] + t * pos.nb[1]);
        const char* xr = x.bytes() + b * x.nb[0] + h * x.nb[1] + t * x.nb[2];
        A y;
        if (i < 2 * half) {
            long long j = i % half;
            A c = load_elem<A>(cs.bytes() + p * cs.nb[0] + j * cs.nb[1], cs.dtype);
            A s = load_elem<A>(sn.bytes() + p * sn.nb[0] + j * sn.nb[1], sn.dtype);
            A x1 = load_elem<A>(xr + j * x.nb[3], x.dtype), x2 = load_elem<A>(xr + (j + half) * x.nb[3], x.dtype);
            A y1, y2;
            kv_rope_pair(x1, x2, c, s, &y1, &y2);
            y = i < half ? y1 : y2;
        } else {
            y = load_elem<A>(xr + i * x.nb[3], x.dtype);
        }
        store_elem<A>(d.bytes() + b * d.nb[0] + h * d.nb[1] + t * d.nb[2] + i * d.nb[3], d.dtype, y);
    }
}
}  // namespace

void rope_forward(const OpContext& ctx, const OpCall& c) {
    long long n = c.dst.numel();
    if (!n) return;
    unsigned blocks = blocks_for(n, 256);
    if (is_f64_call(c))
        rope_kernel<double><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1], c.src[2], c.src[3], c.p.n_rot);
    else
        rope_kernel<float><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1], c.src[2], c.src[3], c.p.n_rot);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
