// QUANTIZE / DEQUANTIZE rows on the CPU through the shared block formats
// (kernels/common/quant_formats.h); rows are independent, so they split across threads.
#include "cpu_common.h"
#include "kernels/common/quant_formats.h"

namespace kv::cpu {

void quantize_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& x = c.src[0];
    const TensorView& d = c.dst;
    const QuantFormat f = QuantFormat(c.p.qformat);
    const int64_t n = x.last(), rows = x.rows();
    parallel_rows(ctx, rows, n * 4, [&](int64_t r0, int64_t r1) {
        float* buf = scratch<float>(0, n);
        for (int64_t r = r0; r < r1; ++r) {
            load_row(x.bytes() + x.row_offset(r), last_stride(x), x.dtype, n, buf);
            quantize_row_inplace(f, buf, n, reinterpret_cast<uint8_t*>(d.bytes() + d.row_offset(r)), c.p.qlevels);
        }
    });
}

void dequantize_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& q = c.src[0];
    const TensorView& d = c.dst;
    const QuantFormat f = QuantFormat(c.p.qformat);
    const int64_t n = d.last(), rows = d.rows();
    parallel_rows(ctx, rows, n * 2, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t off = d.row_offset(r);
            float* out = row_out<float>(d, off, n, 0);
            dequantize_row(f, reinterpret_cast<const uint8_t*>(q.bytes() + q.row_offset(r)), n, out, c.p.qlevels);
            row_commit(d, off, n, out);
        }
    });
}

}  // namespace kv::cpu
