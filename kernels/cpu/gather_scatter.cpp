// GATHER and SCATTER along one axis with an integer index (torch.gather / scatter_ semantics).
// The KV-cache pattern (axis = slot dim, index constant along the head dim) moves whole rows.
#include <cstring>

#include "cpu_common.h"

namespace kv::cpu {

namespace {
inline int64_t read_index(const TensorView& v, int64_t off) {
    return v.dtype == DType::I64 ? *reinterpret_cast<const int64_t*>(v.bytes() + off)
                                 : int64_t(*reinterpret_cast<const int32_t*>(v.bytes() + off));
}

// Copy n elements between possibly different dtypes/strides.
inline void move_elems(const char* sp, int64_t ss, DType sdt, char* dp, int64_t ds, DType ddt, int64_t n) {
    if (sdt == ddt) {
        int64_t es = dtype_size(sdt);
        if (ss == es && ds == es) {
            std::memcpy(dp, sp, size_t(n * es));
        } else {
            for (int64_t i = 0; i < n; ++i) std::memcpy(dp + i * ds, sp + i * ss, size_t(es));
        }
        return;
    }
    double* buf = scratch<double>(3, n);
    load_row(sp, ss, sdt, n, buf);
    store_row(dp, ds, ddt, n, buf);
}

// it = the tensor iterated over (dst for gather, values for scatter); other = the indexed one.
// gather: it = dst (write), other = src (read). scatter: it = values (read), other = dst (write).
void index_rows(const OpContext& ctx, const TensorView& it, const TensorView& other, const TensorView& index_raw, int ax,
                bool gather) {
    const int nd = it.ndim;
    const TensorView ix = broadcast_to(index_raw, it);
    const int64_t rows = it.rows(), n = it.last();
    const int64_t it_st = last_stride(it), ot_st = last_stride(other), ix_st = last_stride(ix);
    parallel_rows(ctx, rows, n, [&](int64_t r0, int64_t r1) {
        int64_t m[KV_MAX_DIMS] = {0};
        for (int64_t r = r0; r < r1; ++r) {
            int64_t rem = r;
            for (int k = nd - 2; k >= 0; --k) {
                m[k] = rem % it.ne[k];
                rem /= it.ne[k];
            }
            int64_t it_off = 0, ot_base = 0, ix_off = 0;
            for (int k = 0; k < nd - 1; ++k) {
                it_off += m[k] * it.nb[k];
                ix_off += m[k] * ix.nb[k];
                if (k != ax) ot_base += m[k] * other.nb[k];
            }
            if (ax == nd - 1) {
                for (int64_t j = 0; j < n; ++j) {
                    int64_t id = read_index(ix, ix_off + j * ix_st);
                    const char* sp;
                    char* dp;
                    if (gather) {
                        sp = other.bytes() + ot_base + id * other.nb[ax];
                        dp = it.bytes() + it_off + j * it_st;
                        move_elems(sp, 0, other.dtype, dp, 0, it.dtype, 1);
                    } else {
                        sp = it.bytes() + it_off + j * it_st;
                        dp = other.bytes() + ot_base + id * other.nb[ax];
                        move_elems(sp, 0, it.dtype, dp, 0, other.dtype, 1);
                    }
                }
            } else if (ix_st == 0 || n == 1) {  // whole-row move
                int64_t id = read_index(ix, ix_off);
                char* ot = other.bytes() + ot_base + id * other.nb[ax];
                if (gather) move_elems(ot, ot_st, other.dtype, it.bytes() + it_off, it_st, it.dtype, n);
                else move_elems(it.bytes() + it_off, it_st, it.dtype, ot, ot_st, other.dtype, n);
            } else {
                for (int64_t j = 0; j < n; ++j) {
                    int64_t id = read_index(ix, ix_off + j * ix_st);
                    char* ot = other.bytes() + ot_base + id * other.nb[ax] + j * ot_st;
                    char* ip = it.bytes() + it_off + j * it_st;
                    if (gather) move_elems(ot, 0, other.dtype, ip, 0, it.dtype, 1);
                    else move_elems(ip, 0, it.dtype, ot, 0, other.dtype, 1);
                }
            }
        }
    });
}
}  // namespace

void gather_forward(const OpContext& ctx, const OpCall& c) { index_rows(ctx, c.dst, c.src[0], c.src[1], c.p.axis, true); }

void scatter_forward(const OpContext& ctx, const OpCall& c) { index_rows(ctx, c.src[0], c.dst, c.src[1], c.p.axis, false); }

}  // namespace kv::cpu
