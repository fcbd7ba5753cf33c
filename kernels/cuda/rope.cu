// Rotate-half RoPE on CUDA: one thread per (b, h, t, channel); pairs use kv_rope_pair (and
// its transpose kv_rope_pair_backward for ROPE_BACKWARD) from kernels/common/element_math.h,
// exactly like the CPU kernel.
#include "cuda_common.cuh"

namespace kv::cuda {

namespace {
template <class A, bool Backward>
__global__ void rope_kernel(TensorView d, TensorView x, TensorView pos, TensorView cs, TensorView sn, int n_rot, int acc) {
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
            if (Backward) kv_rope_pair_backward(x1, x2, c, s, &y1, &y2);
            else kv_rope_pair(x1, x2, c, s, &y1, &y2);
            y = i < half ? y1 : y2;
        } else {
            y = load_elem<A>(xr + i * x.nb[3], x.dtype);
        }
        char* dp = d.bytes() + b * d.nb[0] + h * d.nb[1] + t * d.nb[2] + i * d.nb[3];
        if (acc) y += load_elem<A>(dp, d.dtype);
        store_elem<A>(dp, d.dtype, y);
    }
}

template <bool Backward>
void rope_launch(const OpContext& ctx, const OpCall& c) {
    long long n = c.dst.numel();
    if (!n) return;
    unsigned blocks = blocks_for(n, 256);
    const int acc = Backward && (c.p.accumulate & KV_ACC_DST);
    if (is_f64_call(c))
        rope_kernel<double, Backward><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1], c.src[2], c.src[3], c.p.n_rot, acc);
    else
        rope_kernel<float, Backward><<<blocks, 256, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.src[1], c.src[2], c.src[3], c.p.n_rot, acc);
    KV_CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_forward(const OpContext& ctx, const OpCall& c) { rope_launch<false>(ctx, c); }
void rope_backward(const OpContext& ctx, const OpCall& c) { rope_launch<true>(ctx, c); }

}  // namespace kv::cuda
