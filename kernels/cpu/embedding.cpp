// Embedding lookup: out[i, :] = table[ids[i], :] (ids validated by the engine).
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
}  // namespace

void embedding_forward(const OpContext& ctx, const OpCall& c) {
    if (is_f64_call(c)) embedding_rows<double>(ctx, c);
    else embedding_rows<float>(ctx, c);
}

}  // namespace kv::cpu
