// Embedding lookup: out[i, :] = table[ids[i], :] (ids validated by the engine), and its
// gradient dtable[ids[i], :] += dy[i, :]. The gradient sorts token indices by id and gives each
// thread whole table rows, so duplicates add up in token order whatever the thread count.
#include <algorithm>
#include <numeric>

#include "cpu_common.h"

namespace kv::cpu {

namespace {
inline int64_t read_index(const TensorView& v, int64_t off) {
    return v.dtype == DType::I64 ? *reinterpret_cast<const int64_t*>(v.bytes() + off)
                                 : int64_t(*reinterpret_cast<const int32_t*>(v.bytes() + off));
}

template <class A>
void embedding_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& d = c.dst;
    const TensorView& table = c.src[0];
    const TensorView& ids = c.src[1];
    const int64_t C = table.ne[1], rows = ids.numel();
    // Row r of dst corresponds to element r of ids (same outer shape).
    TensorView idx_as_rows = ids;  // treat ids as a (rows) array via its own strides
    parallel_rows(ctx, rows, C, [&](int64_t r0, int64_t r1) {
        A* buf = scratch<A>(0, C);
        for (int64_t r = r0; r < r1; ++r) {
            // offset of element r in ids: ids has ndim dims; row_offset treats the last dim as a row,
            // so compute the full multi-index by hand.
            int64_t rem = r, off = 0;
            for (int i = idx_as_rows.ndim - 1; i >= 0; --i) {
                off += (rem % idx_as_rows.ne[i]) * idx_as_rows.nb[i];
                rem /= idx_as_rows.ne[i];
            }
            int64_t id = read_index(ids, off);
            const char* src = table.bytes() + id * table.nb[0];
            char* dst = d.bytes() + d.row_offset(r);
            if (table.dtype == d.dtype && table.nb[1] == dtype_size(table.dtype) && last_stride(d) == dtype_size(d.dtype)) {
                std::memcpy(dst, src, size_t(C * dtype_size(d.dtype)));
            } else {
                load_row(src, table.nb[1], table.dtype, C, buf);
                store_row(dst, last_stride(d), d.dtype, C, buf);
            }
        }
    });
}
template <class A>
void embedding_backward_rows(const OpContext& ctx, const OpCall& c) {
    const TensorView& dt = c.dst;  // (V, C)
    const TensorView& dy = c.src[0];
    const TensorView& ids = c.src[1];
    const int64_t V = dt.ne[0], C = dt.ne[1], n = ids.numel();
    if (!(c.p.accumulate & KV_ACC_DST)) {
        parallel_rows(ctx, V, C, [&](int64_t r0, int64_t r1) {
            A* z = scratch<A>(0, C);
            std::fill(z, z + C, A(0));
            for (int64_t r = r0; r < r1; ++r) store_row(dt.bytes() + r * dt.nb[0], dt.nb[1], dt.dtype, C, z);
        });
    }
    std::vector<int64_t> id((size_t)n), order((size_t)n);
    for (int64_t i = 0; i < n; ++i) id[size_t(i)] = index_at(ids, i);
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return id[size_t(a)] < id[size_t(b)]; });
    // Runs of equal ids; run k covers order[starts[k], starts[k + 1]).
    std::vector<int64_t> starts;
    for (int64_t k = 0; k < n; ++k)
        if (k == 0 || id[size_t(order[size_t(k)])] != id[size_t(order[size_t(k - 1)])]) starts.push_back(k);
    starts.push_back(n);
    const int64_t runs = int64_t(starts.size()) - 1;
    parallel_rows(ctx, runs, C * std::max<int64_t>(1, n / std::max<int64_t>(runs, 1)), [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
            const int64_t v = id[size_t(order[size_t(starts[size_t(k)])])];
            if (v < 0 || v >= V) continue;  // the engine validates ids; never write out of bounds
            const int64_t off = v * dt.nb[0];
            A* out = row_out_acc<A>(dt, off, C, 1, true);
            for (int64_t e = starts[size_t(k)]; e < starts[size_t(k + 1)]; ++e) {
                const int64_t i = order[size_t(e)];
                const A* g = row_in<A>(dy, dy.row_offset(i), C, 2);
                for (int64_t j = 0; j < C; ++j) out[j] += g[j];
            }
            row_commit(dt, off, C, out);
        }
    });
}
}  // namespace

void embedding_backward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) embedding_backward_rows<double>(ctx, c);
    else embedding_backward_rows<float>(ctx, c);
}

void embedding_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) embedding_rows<double>(ctx, c);
    else embedding_rows<float>(ctx, c);
}

}  // namespace kv::cpu
