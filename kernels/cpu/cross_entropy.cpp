// Cross-entropy of logit rows against integer targets (ignore_index rows give 0), optionally
// over a subset of the columns (classification on logits), and its gradient
// dlogits = alpha * dloss * (softmax - onehot). Log-sum-exp with the row max subtracted.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "kernels/common/element_math.h"

namespace kv::cpu {

namespace {

// Per-row softmax statistics of z: max m and sum s = sum exp(z - m), so lse = m + log(s).
template <class A>
void row_stats(const A* z, int64_t k, A* m_out, A* s_out) {
    A m = -std::numeric_limits<A>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < k; ++j) m = z[j] > m ? z[j] : m;
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < k; ++j) s += kv_exp(z[j] - m);
    *m_out = m;
    *s_out = s;
}

template <class A>
void cross_entropy_rows(const OpContext& ctx, const OpCall& c, bool backward) {
    const TensorView& logits = c.src[0];
    const TensorView& targets = c.src[1];
    const bool subset = has_src(c, 2);
    const bool has_dloss = backward && has_src(c, 3);
    const int64_t V = logits.last(), rows = logits.rows();
    const int64_t K = subset ? c.src[2].numel() : V;
    std::vector<int64_t> cols;
    if (subset)
        for (int64_t k = 0; k < K; ++k) cols.push_back(index_at(c.src[2], k));
    const TensorView& d = c.dst;
    const bool acc = c.p.accumulate & KV_ACC_DST;
    const A alpha = A(c.p.alpha);
    parallel_rows(ctx, rows, V * 3, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const int64_t t = index_at(targets, r);
            const bool ignored = t == int64_t(c.p.ignore_index);
            const A* zr;
            if (subset) {
                A* z = scratch<A>(0, K);
                const char* base = logits.bytes() + logits.row_offset(r);
                for (int64_t k = 0; k < K; ++k) load_row(base + cols[size_t(k)] * last_stride(logits), 0, logits.dtype, 1, z + k);
                zr = z;
            } else {
                zr = row_in<A>(logits, logits.row_offset(r), V, 0);
            }
            A m = 0, s = 1;
            if (!ignored) row_stats(zr, K, &m, &s);
            if (!backward) {
                // Out-of-range targets (the engine validates host tensors) give NaN, never a read.
                A loss = ignored ? A(0)
                                 : (t >= 0 && t < K ? m + std::log(s) - zr[t] : std::numeric_limits<A>::quiet_NaN());
                store_row(d.bytes() + elem_offset(d, r), 0, d.dtype, 1, &loss);
                continue;
            }
            const int64_t doff = d.row_offset(r);
            A* out = row_out_acc<A>(d, doff, V, 1, acc);
            if (!acc)
                for (int64_t j = 0; j < V; ++j) out[j] = 0;
            if (!ignored) {
                A scale = alpha;
                if (has_dloss) {
                    A dl = 0;
                    load_row(c.src[3].bytes() + elem_offset(c.src[3], r), 0, c.src[3].dtype, 1, &dl);
                    scale *= dl;
                }
                const A inv = scale / s;
                if (subset) {
                    for (int64_t k = 0; k < K; ++k)
                        out[cols[size_t(k)]] += kv_exp(zr[k] - m) * inv - (k == t ? scale : A(0));
                } else {
                    for (int64_t j = 0; j < V; ++j) out[j] += kv_exp(zr[j] - m) * inv;
                    if (t >= 0 && t < V) out[t] -= scale;
                }
            }
            row_commit(d, doff, V, out);
        }
    });
}

}  // namespace

void cross_entropy_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) cross_entropy_rows<double>(ctx, c, false);
    else cross_entropy_rows<float>(ctx, c, false);
}

void cross_entropy_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) cross_entropy_rows<double>(ctx, c, true);
    else cross_entropy_rows<float>(ctx, c, true);
}

}  // namespace kv::cpu
