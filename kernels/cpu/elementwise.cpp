// Elementwise CPU kernels: ADD, MUL, SCALE, SILU, SWIGLU, COPY.
// One row loop handles every dtype, stride and broadcast; rows that are already f32 (or f64)
// and unit-stride are used in place, others go through per-thread scratch.
#include <cstring>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {

// Iterate rows of dst; when everything is contiguous and unbroadcast, use flat 4096-blocks
// so short rows do not dominate the cost.
template <class F>
void for_rows(const OpContext& ctx, const TensorView& d, const TensorView* srcs, int nsrc, F&& fn) {
    bool flat = d.is_contiguous();
    for (int i = 0; i < nsrc; ++i) flat = flat && srcs[i].is_contiguous() && srcs[i].numel() == d.numel();
    if (flat) {
        const int64_t total = d.numel(), blk = 4096;
        int64_t rows = (total + blk - 1) / blk;
        parallel_rows(ctx, rows, blk, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                int64_t e0 = r * blk, n = (e0 + blk <= total) ? blk : total - e0;
                int64_t offs[KV_MAX_SRC + 1];
                offs[0] = e0 * dtype_size(d.dtype);
                for (int i = 0; i < nsrc; ++i) offs[i + 1] = e0 * dtype_size(srcs[i].dtype);
                fn(offs, n);
            }
        });
        return;
    }
    int64_t rows = d.rows(), n = d.last();
    parallel_rows(ctx, rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            int64_t offs[KV_MAX_SRC + 1];
            offs[0] = d.row_offset(r);
            for (int i = 0; i < nsrc; ++i) offs[i + 1] = srcs[i].row_offset(r);
            fn(offs, n);
        }
    });
}

template <class A, class F>
void unary(const OpContext& ctx, const OpCall& c, F f) {
    TensorView d = c.dst, a = broadcast_to(c.src[0], d);
    // For flat iteration the row stride of a must be the natural one.
    for_rows(ctx, d, &a, 1, [&](const int64_t* off, int64_t n) {
        const A* x = row_in<A>(a, off[1], n, 0);
        A* y = row_out<A>(d, off[0], n, 1);
        for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
        row_commit(d, off[0], n, y);
    });
}

template <class A, class F>
void binary(const OpContext& ctx, const OpCall& c, F f) {
    TensorView d = c.dst;
    TensorView s[2] = {broadcast_to(c.src[0], d), broadcast_to(c.src[1], d)};
    for_rows(ctx, d, s, 2, [&](const int64_t* off, int64_t n) {
        const A* x = row_in<A>(s[0], off[1], n, 0);
        const A* y = row_in<A>(s[1], off[2], n, 1);
        A* z = row_out<A>(d, off[0], n, 2);
        for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
        row_commit(d, off[0], n, z);
    });
}

}  // namespace

void add_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) binary<double>(ctx, c, [](double a, double b) { return a + b; });
    else binary<float>(ctx, c, [](float a, float b) { return a + b; });
}

void mul_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) binary<double>(ctx, c, [](double a, double b) { return a * b; });
    else binary<float>(ctx, c, [](float a, float b) { return a * b; });
}

void swiglu_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) binary<double>(ctx, c, [](double g, double u) { return kv_silu(g) * u; });
    else binary<float>(ctx, c, [](float g, float u) { return kv_silu(g) * u; });
}

void scale_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) {
        double s = c.p.alpha;
        unary<double>(ctx, c, [s](double x) { return s * x; });
    } else {
        float s = c.p.alpha;
        unary<float>(ctx, c, [s](float x) { return s * x; });
    }
}

void silu_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) unary<double>(ctx, c, [](double x) { return kv_silu(x); });
    else unary<float>(ctx, c, [](float x) { return kv_silu(x); });
}

void copy_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& s = c.src[0];
    if (d.dtype == s.dtype) {  // bit-exact byte copy
        const int64_t es = dtype_size(d.dtype);
        for_rows(ctx, d, &s, 1, [&](const int64_t* off, int64_t n) {
            char* dp = d.bytes() + off[0];
            const char* sp = s.bytes() + off[1];
            int64_t ds = last_stride(d), ss = last_stride(s);
            if (ds == es && ss == es) {
                std::memcpy(dp, sp, size_t(n * es));
            } else {
                for (int64_t i = 0; i < n; ++i) std::memcpy(dp + i * ds, sp + i * ss, size_t(es));
            }
        });
        return;
    }
    if (dtype_is_int(d.dtype) && dtype_is_int(s.dtype)) {
        for_rows(ctx, d, &s, 1, [&](const int64_t* off, int64_t n) {
            int64_t* buf = scratch<int64_t>(0, n);
            load_row(s.bytes() + off[1], last_stride(s), s.dtype, n, buf);
            store_row(d.bytes() + off[0], last_stride(d), d.dtype, n, buf);
        });
        return;
    }
    bool wide = d.dtype == DType::F64 || s.dtype == DType::F64 || dtype_is_int(d.dtype) || dtype_is_int(s.dtype);
    if (wide) {
        for_rows(ctx, d, &s, 1, [&](const int64_t* off, int64_t n) {
            double* buf = scratch<double>(0, n);
            load_row(s.bytes() + off[1], last_stride(s), s.dtype, n, buf);
            store_row(d.bytes() + off[0], last_stride(d), d.dtype, n, buf);
        });
    } else {
        for_rows(ctx, d, &s, 1, [&](const int64_t* off, int64_t n) {
            float* buf = scratch<float>(0, n);
            load_row(s.bytes() + off[1], last_stride(s), s.dtype, n, buf);
            store_row(d.bytes() + off[0], last_stride(d), d.dtype, n, buf);
        });
    }
}

}  // namespace kv::cpu
