// RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + eps) * (offset + w).
#include <cmath>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {
// Typed fast path for unit-stride rows of one storage type: conversions happen in registers,
// no staging through scratch (bf16 rows would otherwise cost two extra L1 passes).
template <class T>
void rmsnorm_rows_typed(const OpContext& ctx, const OpCall& c, const std::vector<float>& w) {
    const TensorView& d = c.dst;
    const TensorView& x = c.src[0];
    const int64_t n = x.last(), rows = x.rows();
    const float eps = c.p.eps;
    parallel_rows(ctx, rows, n, [&](int64_t r0, int64_t r1) {
        const float* wp = w.data();
        for (int64_t r = r0; r < r1; ++r) {
            if (r + 1 < r1) prefetch_row(x, x.row_offset(r + 1), n);
            const T* xr = reinterpret_cast<const T*>(x.bytes() + x.row_offset(r));
            T* yr = reinterpret_cast<T*>(d.bytes() + d.row_offset(r));
            float ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; ++i) {
                const float v = to_f32(xr[i]);
                ss += v * v;
            }
            const float inv = kv_rms_inv(ss, n, eps);
            for (int64_t i = 0; i < n; ++i) yr[i] = from_f32<T>(to_f32(xr[i]) * inv * wp[i]);
        }
    });
}

template <class A>
void rmsnorm_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& x = c.src[0];
    const bool has_w = c.nsrc > 1;
    const int64_t n = x.last(), rows = x.rows();
    const A eps = A(c.p.eps), off = A(c.p.weight_offset);
    std::vector<A> w(size_t(n), A(1));
    if (has_w) {
        load_row(c.src[1].bytes(), last_stride(c.src[1]), c.src[1].dtype, n, w.data());
        for (auto& v : w) v += off;
    }
    parallel_rows(ctx, rows, n, [&](int64_t r0, int64_t r1) {
        const A* wp = w.data();
        for (int64_t r = r0; r < r1; ++r) {
            // f32 rows are read in place (no staging copy); the row stays in L1 for pass 2.
            if (r + 1 < r1) prefetch_row(x, x.row_offset(r + 1), n);
            const A* xr = row_in<A>(x, x.row_offset(r), n, 0);
            A ss = 0;
#pragma omp simd reduction(+ : ss)
            for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
            const A inv = kv_rms_inv(ss, n, eps);
            const int64_t doff = d.row_offset(r);
            A* yr = row_out<A>(d, doff, n, 1);
            for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * wp[i];
            row_commit(d, doff, n, yr);
        }
    });
}
}  // namespace

void rmsnorm_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& x = c.src[0];
    const TensorView& d = c.dst;
    const bool unit = last_stride(x) == dtype_size(x.dtype) && last_stride(d) == dtype_size(d.dtype);
    if (unit && x.dtype == d.dtype && (x.dtype == DType::BF16 || x.dtype == DType::F16)) {
        std::vector<float> w((size_t)x.last(), 1.0f);
        if (c.nsrc > 1) {
            load_row(c.src[1].bytes(), last_stride(c.src[1]), c.src[1].dtype, x.last(), w.data());
            for (auto& v : w) v += c.p.weight_offset;
        }
        if (x.dtype == DType::BF16) rmsnorm_rows_typed<bf16_t>(ctx, c, w);
        else rmsnorm_rows_typed<f16_t>(ctx, c, w);
        return;
    }
    if (is_f64_call(c)) rmsnorm_rows<double>(ctx, c);
    else rmsnorm_rows<float>(ctx, c);
}

}  // namespace kv::cpu
