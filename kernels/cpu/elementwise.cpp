// Elementwise CPU kernels: ADD, MUL, SCALE, SILU, SWIGLU, COPY, AXPY, and the gradients
// SILU_BACKWARD, SWIGLU_BACKWARD. One row loop handles every dtype, stride and broadcast; rows
// that are already f32 (or f64) and unit-stride are used in place, others go through scratch.
#include <cstring>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {

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

// Gradient rows: `nin` sources broadcast to dst, one or two outputs (dst, dst2) of dst's
// shape, each overwritten or accumulated per p.accumulate. f(in, o1, o2, n) adds or assigns
// itself through the `acc` flags it receives.
template <class A, class F>
void grad_rows(const OpContext& ctx, const OpCall& c, int nin, int nout, F f) {
    TensorView d = c.dst;
    TensorView rest[4];
    int nr = 0;
    if (nout > 1) rest[nr++] = c.dst2;
    for (int i = 0; i < nin; ++i) rest[nr++] = broadcast_to(c.src[i], d);
    const bool acc1 = c.p.accumulate & KV_ACC_DST, acc2 = c.p.accumulate & KV_ACC_DST2;
    for_rows(ctx, d, rest, nr, [&](const int64_t* off, int64_t n) {
        const A* in[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < nin; ++i) in[i] = row_in<A>(rest[nout - 1 + i], off[nout + i], n, i);
        A* o1 = row_out_acc<A>(d, off[0], n, 3, acc1);
        A* o2 = nout > 1 ? row_out_acc<A>(c.dst2, off[1], n, 4, acc2) : nullptr;
        f(in, o1, o2, n, acc1, acc2);
        row_commit(d, off[0], n, o1);
        if (o2) row_commit(c.dst2, off[1], n, o2);
    });
}

template <class A>
void silu_backward_rows(const OpContext& ctx, const OpCall& c) {
    grad_rows<A>(ctx, c, 2, 1, [](const A* const* in, A* dx, A*, int64_t n, bool acc, bool) {
        const A *x = in[0], *dy = in[1];
        for (int64_t i = 0; i < n; ++i) dx[i] = (acc ? dx[i] : A(0)) + dy[i] * kv_silu_grad(x[i]);
    });
}

template <class A>
void swiglu_backward_rows(const OpContext& ctx, const OpCall& c) {
    const bool gelu = c.p.act == int(GateAct::GELU_TANH);
    grad_rows<A>(ctx, c, 3, 2, [gelu](const A* const* in, A* dgate, A* dup, int64_t n, bool acc1, bool acc2) {
        const A *gate = in[0], *up = in[1], *dy = in[2];
        for (int64_t i = 0; i < n; ++i) {
            A dg, du;
            if (gelu) kv_geglu_grad(gate[i], up[i], dy[i], &dg, &du);
            else kv_swiglu_grad(gate[i], up[i], dy[i], &dg, &du);
            dgate[i] = (acc1 ? dgate[i] : A(0)) + dg;
            dup[i] = (acc2 ? dup[i] : A(0)) + du;
        }
    });
}

}  // namespace

void silu_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) silu_backward_rows<double>(ctx, c);
    else silu_backward_rows<float>(ctx, c);
}

void swiglu_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) swiglu_backward_rows<double>(ctx, c);
    else swiglu_backward_rows<float>(ctx, c);
}

void axpy_forward(const OpContext& ctx, const OpCall& c) {
    OpCall a = c;
    a.p.accumulate = KV_ACC_DST;  // AXPY always adds into dst
    if (is_f64_call(c)) {
        const double al = c.p.alpha;
        grad_rows<double>(ctx, a, 1, 1, [al](const double* const* in, double* y, double*, int64_t n, bool, bool) {
            for (int64_t i = 0; i < n; ++i) y[i] += al * in[0][i];
        });
    } else {
        const float al = c.p.alpha;
        grad_rows<float>(ctx, a, 1, 1, [al](const float* const* in, float* y, float*, int64_t n, bool, bool) {
            for (int64_t i = 0; i < n; ++i) y[i] += al * in[0][i];
        });
    }
}

void add_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) binary<double>(ctx, c, [](double a, double b) { return a + b; });
    else binary<float>(ctx, c, [](float a, float b) { return a + b; });
}

void mul_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) binary<double>(ctx, c, [](double a, double b) { return a * b; });
    else binary<float>(ctx, c, [](float a, float b) { return a * b; });
}

void swiglu_forward(const OpContext& ctx, const OpCall& c) {
    if (c.p.act == int(GateAct::GELU_TANH)) {
        if (is_f64_call(c)) binary<double>(ctx, c, [](double g, double u) { return kv_gelu_tanh(g) * u; });
        else binary<float>(ctx, c, [](float g, float u) { return kv_gelu_tanh(g) * u; });
        return;
    }
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
