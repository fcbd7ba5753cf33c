// Reductions over the last dimension: SUM, MAX, NORM (L2). Accumulate in f64 for f64 input,
// f32 otherwise (pairwise over 8 lanes to keep long rows accurate). GRAD_NORM_SQ reduces a
// whole tensor in f64 over fixed blocks summed in order (independent of the thread count).
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_common.h"

namespace kv::cpu {

namespace {
template <class A>
A lanes_sum(const A* x, int64_t n, bool squares) {
    A acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += squares ? x[i + k] * x[i + k] : x[i + k];
    A tail = 0;
    for (; i < n; ++i) tail += squares ? x[i] * x[i] : x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

template <class A>
void reduce_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& x = c.src[0];
    const int64_t n = x.last(), rows = x.rows();
    const OpKind k = c.op;
    // dst holds `rows` elements in row-major order of x's outer dims.
    parallel_rows(ctx, rows, n, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const A* buf = row_in<A>(x, x.row_offset(r), n, 0);
            A v;
            if (k == OpKind::MAX) {
                v = -std::numeric_limits<A>::infinity();
                for (int64_t i = 0; i < n; ++i) v = buf[i] > v || std::isnan(buf[i]) ? buf[i] : v;
            } else if (k == OpKind::SUM) {
                v = lanes_sum(buf, n, false);
            } else {
                v = std::sqrt(lanes_sum(buf, n, true));
            }
            int64_t rem = r, off = 0;
            for (int i = d.ndim - 1; i >= 0; --i) {
                off += (rem % d.ne[i]) * d.nb[i];
                rem /= d.ne[i];
            }
            store_row(d.bytes() + off, 0, d.dtype, 1, &v);
        }
    });
}
double sum_squares_f64(const float* x, int64_t n) {
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
    return acc;
}
double sum_squares_f64(const double* x, int64_t n) {
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
    return acc;
}
}  // namespace

void grad_norm_sq_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& x = c.src[0];
    // Blocks: fixed 64 Ki-element pieces of a contiguous tensor, else its rows.
    TensorView v = x;
    int64_t blk = x.last(), blocks = x.rows();
    if (x.is_contiguous()) {
        v.ndim = 1;
        v.ne[0] = x.numel();
        v.nb[0] = dtype_size(x.dtype);
        blk = int64_t(1) << 16;
        blocks = (v.ne[0] + blk - 1) / blk;
    }
    std::vector<double> part((size_t)blocks, 0.0);
    const bool wide = x.dtype == DType::F64;
    parallel_rows(ctx, blocks, blk, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            int64_t off, n;
            if (v.ndim == 1) {
                off = b * blk * v.nb[0];
                n = std::min(blk, v.ne[0] - b * blk);
            } else {
                off = v.row_offset(b);
                n = blk;
            }
            part[size_t(b)] = wide ? sum_squares_f64(row_in<double>(v, off, n, 0), n) : sum_squares_f64(row_in<float>(v, off, n, 0), n);
        }
    });
    double total = 0;
    for (double p : part) total += p;
    if (c.p.accumulate & KV_ACC_DST) {
        double prev;
        load_row(c.dst.bytes(), 0, c.dst.dtype, 1, &prev);
        total += prev;
    }
    store_row(c.dst.bytes(), 0, c.dst.dtype, 1, &total);
}

void reduce_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) reduce_rows<double>(ctx, c);
    else reduce_rows<float>(ctx, c);
}

}  // namespace kv::cpu
