// RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + eps) * (offset + w), and its
// gradient (dx per row; dweight summed over rows column by column, so the sum's order never
// depends on the thread count).
#include <algorithm>
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
// Gradient in three passes so dx may overwrite dy: per-row factors, then dweight by column
// chunks (rows in order), then dx.
template <class A>
void rmsnorm_backward_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& x = c.src[0];
    const TensorView& dy = c.src[1];
    const bool has_w = has_src(c, 2);
    const int64_t n = x.last(), rows = x.rows();
    const A eps = A(c.p.eps), off = A(c.p.weight_offset);
    std::vector<A> w((size_t)n, A(1));
    if (has_w) {
        load_row(c.src[2].bytes(), last_stride(c.src[2]), c.src[2].dtype, n, w.data());
        for (auto& v : w) v += off;
    }
    // Per row: r = rms_inv and k = r^3 mean(g x) with g = dy w'.
    std::vector<A> rinv((size_t)rows), kfac((size_t)rows);
    parallel_rows(ctx, rows, 2 * n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const A* xr = row_in<A>(x, x.row_offset(r), n, 0);
            const A* dr = row_in<A>(dy, dy.row_offset(r), n, 1);
            A ss = 0, gx = 0;
#pragma omp simd reduction(+ : ss, gx)
            for (int64_t i = 0; i < n; ++i) {
                ss += xr[i] * xr[i];
                gx += dr[i] * w[size_t(i)] * xr[i];
            }
            const A rr = kv_rms_inv(ss, n, eps);
            rinv[size_t(r)] = rr;
            kfac[size_t(r)] = rr * rr * rr * gx / A(n);
        }
    });
    if (c.dst2.data) {
        const TensorView& dw = c.dst2;
        const bool acc = c.p.accumulate & KV_ACC_DST2;
        constexpr int64_t kCols = 256;
        const int64_t chunks = (n + kCols - 1) / kCols;
        parallel_rows(ctx, chunks, rows * kCols, [&](int64_t q0, int64_t q1) {
            for (int64_t q = q0; q < q1; ++q) {
                const int64_t c0 = q * kCols, nc = std::min(kCols, n - c0);
                A sum[kCols] = {};
                for (int64_t r = 0; r < rows; ++r) {
                    const A* xr = row_in<A>(x, x.row_offset(r) + c0 * last_stride(x), nc, 0);
                    const A* dr = row_in<A>(dy, dy.row_offset(r) + c0 * last_stride(dy), nc, 1);
                    const A rr = rinv[size_t(r)];
                    for (int64_t i = 0; i < nc; ++i) sum[i] += dr[i] * xr[i] * rr;
                }
                const int64_t doff = c0 * dw.nb[0];
                A* out = row_out_acc<A>(dw, doff, nc, 2, acc);
                for (int64_t i = 0; i < nc; ++i) out[i] = (acc ? out[i] : A(0)) + sum[i];
                row_commit(dw, doff, nc, out);
            }
        });
    }
    const bool acc = c.p.accumulate & KV_ACC_DST;
    const TensorView& dx = c.dst;
    parallel_rows(ctx, rows, 2 * n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const A* xr = row_in<A>(x, x.row_offset(r), n, 0);
            const A* dr = row_in<A>(dy, dy.row_offset(r), n, 1);
            const A rr = rinv[size_t(r)], k = kfac[size_t(r)];
            const int64_t doff = dx.row_offset(r);
            A* out = row_out_acc<A>(dx, doff, n, 2, acc);
            for (int64_t i = 0; i < n; ++i) out[i] = (acc ? out[i] : A(0)) + kv_rmsnorm_dx(dr[i] * w[size_t(i)], xr[i], rr, k);
            row_commit(dx, doff, n, out);
        }
    });
}
}  // namespace

void rmsnorm_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) rmsnorm_backward_rows<double>(ctx, c);
    else rmsnorm_backward_rows<float>(ctx, c);
}

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
