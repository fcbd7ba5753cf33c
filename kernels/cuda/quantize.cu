// QUANTIZE / DEQUANTIZE rows on CUDA: one thread per row through the shared block formats
// (rows are one token's head vector, a few hundred values, so a thread per row is enough).
#include "cuda_common.cuh"
#include "kernels/common/quant_formats.h"

namespace kv::cuda {

namespace {
constexpr int kMaxRow = 4096;

QuantLevels levels_of(const OpCall& c) {
    QuantLevels lv;
    for (int k = 0; k < 16; ++k) lv.v[k] = c.p.qlevels[k];
    return lv;
}


__global__ void quantize_kernel(TensorView d, TensorView x, int fmt, QuantLevels lv, long long rows) {
    float buf[kMaxRow];
    const long long n = last_ne(x);
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
        const char* xr = x.bytes() + row_offset(x, r);
        for (long long i = 0; i < n; ++i) buf[i] = load_elem<float>(xr + i * last_nb(x), x.dtype);
        quantize_row_inplace(QuantFormat(fmt), buf, n, reinterpret_cast<uint8_t*>(d.bytes() + row_offset(d, r)), lv.v);
    }
}

__global__ void dequantize_kernel(TensorView d, TensorView q, int fmt, QuantLevels lv, long long rows) {
    float buf[kMaxRow];
    const long long n = last_ne(d);
    for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows; r += (long long)gridDim.x * blockDim.x) {
        dequantize_row(QuantFormat(fmt), reinterpret_cast<const uint8_t*>(q.bytes() + row_offset(q, r)), n, buf, lv.v);
        char* dr = d.bytes() + row_offset(d, r);
        for (long long i = 0; i < n; ++i) store_elem<float>(dr + i * last_nb(d), d.dtype, buf[i]);
    }
}
}  // namespace

void quantize_forward(const OpContext& ctx, const OpCall& c) {
    const long long n = c.src[0].ne[c.src[0].ndim - 1];
    if (n > kMaxRow) throw KernelError("cuda quantize: rows longer than 4096 are not supported");
    const long long rows = n ? c.src[0].numel() / n : 0;
    if (!rows) return;
    quantize_kernel<<<blocks_for(rows, 64), 64, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.p.qformat, levels_of(c), rows);
    KV_CUDA_CHECK_LAUNCH();
}

void dequantize_forward(const OpContext& ctx, const OpCall& c) {
    const long long n = c.dst.ne[c.dst.ndim - 1];
    if (n > kMaxRow) throw KernelError("cuda dequantize: rows longer than 4096 are not supported");
    const long long rows = n ? c.dst.numel() / n : 0;
    if (!rows) return;
    dequantize_kernel<<<blocks_for(rows, 64), 64, 0, stream_of(ctx)>>>(c.dst, c.src[0], c.p.qformat, levels_of(c), rows);
    KV_CUDA_CHECK_LAUNCH();
}

}  // namespace kv::cuda
