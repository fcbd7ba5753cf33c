// Row softmax over the last dimension with an input scale: y = softmax(alpha * x).
// Max-subtracted for stability; a row of all -inf yields zeros instead of NaN.
#include <cmath>
#include <limits>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {
template <class A>
void softmax_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& x = c.src[0];
    const int64_t n = x.last(), rows = x.rows();
    const A alpha = A(c.p.alpha);
    parallel_rows(ctx, rows, n * 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const A* xr = row_in<A>(x, x.row_offset(r), n, 0);
            const int64_t doff = d.row_offset(r);
            A* buf = row_out<A>(d, doff, n, 1);
            A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
            for (int64_t i = 0; i < n; ++i) m = alpha * xr[i] > m ? alpha * xr[i] : m;
            A sum = 0;
            if (m == -std::numeric_limits<A>::infinity()) {
                for (int64_t i = 0; i < n; ++i) buf[i] = 0;
            } else {
                for (int64_t i = 0; i < n; ++i) buf[i] = kv_exp(alpha * xr[i] - m);
#pragma omp simd reduction(+ : sum)
                for (int64_t i = 0; i < n; ++i) sum += buf[i];
                const A inv = A(1) / sum;
                for (int64_t i = 0; i < n; ++i) buf[i] *= inv;
            }
            row_commit(d, doff, n, buf);
        }
    });
}
}  // namespace

void softmax_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) softmax_rows<double>(ctx, c);
    else softmax_rows<float>(ctx, c);
}

}  // namespace kv::cpu
