// Reductions over the last dimension: SUM, MAX, NORM (L2). Accumulate in f64 for f64 input,
// f32 otherwise (pairwise over 8 lanes to keep long rows accurate).
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
}  // namespace

void reduce_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) reduce_rows<double>(ctx, c);
    else reduce_rows<float>(ctx, c);
}

}  // namespace kv::cpu
