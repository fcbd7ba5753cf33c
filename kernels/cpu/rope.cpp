// Rotate-half RoPE: for each (b, h, t) row, channel pairs (i, i + n_rot/2) rotate by the
// angle table row of the token's position; channels >= n_rot pass through. The backward
// applies the transposed rotation to dy (one loop, a template flag).
#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {
template <class A, bool Backward>
void rope_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& x = c.src[0];
    const TensorView& pos = c.src[1];
    const TensorView& cs = c.src[2];
    const TensorView& sn = c.src[3];
    const int64_t B = x.ne[0], NH = x.ne[1], T = x.ne[2], HS = x.ne[3];
    const int64_t half = c.p.n_rot / 2;
    const int64_t rows = B * NH * T;
    parallel_rows(ctx, rows, HS * 2, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            int64_t t = r % T, h = (r / T) % NH, b = r / (T * NH);
            int64_t pb = pos.ne[0] == 1 ? 0 : b;
            int32_t p = *reinterpret_cast<const int32_t*>(pos.bytes() + pb * pos.nb[0] + t * pos.nb[1]);
            const A* cr = row_in<A>(cs, p * cs.nb[0], half, 1);
            const A* sr = row_in<A>(sn, p * sn.nb[0], half, 2);
            const char* xr = x.bytes() + b * x.nb[0] + h * x.nb[1] + t * x.nb[2];
            char* dr = d.bytes() + b * d.nb[0] + h * d.nb[1] + t * d.nb[2];
            const A* xin = row_in<A>(x, xr - x.bytes(), HS, 3);
            const bool acc = Backward && (c.p.accumulate & KV_ACC_DST);
            A* out = row_out_acc<A>(d, dr - d.bytes(), HS, 0, acc);
            if (acc) {
                for (int64_t i = 2 * half; i < HS; ++i) out[i] += xin[i];
            } else if (out != xin) {
                for (int64_t i = 2 * half; i < HS; ++i) out[i] = xin[i];
            }
            for (int64_t i = 0; i < half; ++i) {
                A y1, y2;
                if (Backward) kv_rope_pair_backward(xin[i], xin[i + half], cr[i], sr[i], &y1, &y2);
                else kv_rope_pair(xin[i], xin[i + half], cr[i], sr[i], &y1, &y2);
                out[i] = acc ? out[i] + y1 : y1;
                out[i + half] = acc ? out[i + half] + y2 : y2;
            }
            row_commit(d, dr - d.bytes(), HS, out);
        }
    });
}
}  // namespace

void rope_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) rope_rows<double, false>(ctx, c);
    else rope_rows<float, false>(ctx, c);
}

void rope_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) rope_rows<double, true>(ctx, c);
    else rope_rows<float, true>(ctx, c);
}

}  // namespace kv::cpu
