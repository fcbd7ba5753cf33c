// Helpers shared by the CPU kernels: row loads/stores with dtype conversion and strides,
// broadcasting views, per-thread scratch rows and the OpenMP row partitioner.
// Kernels compute in f32 (f64 when the call is f64); storage dtypes are converted per row
// through L1-resident scratch, which keeps one code path per op for every dtype.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels/common/op.h"
#include "kernels/cpu/unit_pool.h"

namespace kv::cpu {

// ---- scalar conversions (hardware F16C when available; same results as the shared ones) --
inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_f32(h);
#endif
}
inline uint16_t f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return f32_to_f16(f);
#endif
}

// Load n elements (byte stride `st`) of dtype `dt` into out[] as A (float or double).
template <class A>
inline void load_row(const char* p, int64_t st, DType dt, int64_t n, A* out) {
    switch (dt) {
        case DType::F32:
            if (st == 4 && sizeof(A) == 4) {
                std::memcpy(out, p, size_t(n) * 4);
            } else {
                for (int64_t i = 0; i < n; ++i) out[i] = A(*reinterpret_cast<const float*>(p + i * st));
            }
            break;
        case DType::F64:
            for (int64_t i = 0; i < n; ++i) out[i] = A(*reinterpret_cast<const double*>(p + i * st));
            break;
        case DType::BF16:
            if (st == 2) {
                const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
                for (int64_t i = 0; i < n; ++i) out[i] = A(bits_f32(uint32_t(q[i]) << 16));
            } else {
                for (int64_t i = 0; i < n; ++i) out[i] = A(bf16_to_f32(*reinterpret_cast<const uint16_t*>(p + i * st)));
            }
            break;
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) out[i] = A(h2f(*reinterpret_cast<const uint16_t*>(p + i * st)));
            break;
        case DType::I32:
            for (int64_t i = 0; i < n; ++i) out[i] = A(*reinterpret_cast<const int32_t*>(p + i * st));
            break;
        case DType::I64:
            for (int64_t i = 0; i < n; ++i) out[i] = A(*reinterpret_cast<const int64_t*>(p + i * st));
            break;
        case DType::U8:
            for (int64_t i = 0; i < n; ++i) out[i] = A(*reinterpret_cast<const uint8_t*>(p + i * st));
            break;
        default: break;
    }
}

// Store n values from in[] into dtype `dt` with byte stride `st` (round-to-nearest-even).
template <class A>
inline void store_row(char* p, int64_t st, DType dt, int64_t n, const A* in) {
    switch (dt) {
        case DType::F32:
            if (st == 4 && sizeof(A) == 4) {
                std::memcpy(p, in, size_t(n) * 4);
            } else {
                for (int64_t i = 0; i < n; ++i) *reinterpret_cast<float*>(p + i * st) = float(in[i]);
            }
            break;
        case DType::F64:
            for (int64_t i = 0; i < n; ++i) *reinterpret_cast<double*>(p + i * st) = double(in[i]);
            break;
        case DType::BF16:
            if (st == 2) {
                uint16_t* q = reinterpret_cast<uint16_t*>(p);
                for (int64_t i = 0; i < n; ++i) q[i] = f32_to_bf16(float(in[i]));
            } else {
                for (int64_t i = 0; i < n; ++i) *reinterpret_cast<uint16_t*>(p + i * st) = f32_to_bf16(float(in[i]));
            }
            break;
        case DType::F16:
            for (int64_t i = 0; i < n; ++i) *reinterpret_cast<uint16_t*>(p + i * st) = f2h(float(in[i]));
            break;
        case DType::I32:
            for (int64_t i = 0; i < n; ++i) *reinterpret_cast<int32_t*>(p + i * st) = int32_t(in[i]);
            break;
        case DType::I64:
            for (int64_t i = 0; i < n; ++i) *reinterpret_cast<int64_t*>(p + i * st) = int64_t(in[i]);
            break;
        case DType::U8:
            for (int64_t i = 0; i < n; ++i) *reinterpret_cast<uint8_t*>(p + i * st) = uint8_t(in[i]);
            break;
        default: break;
    }
}

// Stride of the innermost dimension in bytes (0 for a scalar).
// A last dim of size 1 may carry any stride (a view made by as_strided; is_contiguous ignores
// it): rows then advance by one element, which is what for_rows' flat blocks assume.
inline int64_t last_stride(const TensorView& v) {
    return !v.ndim ? 0 : v.ne[v.ndim - 1] == 1 ? int64_t(dtype_size(v.dtype)) : v.nb[v.ndim - 1];
}

// `s` seen with `d`'s sizes: dimensions of size 1 in `s` become stride-0 broadcasts.
inline TensorView broadcast_to(const TensorView& s, const TensorView& d) {
    TensorView r = s;
    for (int i = 0; i < d.ndim; ++i) {
        if (s.ne[i] != d.ne[i]) r.nb[i] = 0;
        r.ne[i] = d.ne[i];
    }
    return r;
}

// Per-thread scratch rows (slot 0..5), grown on demand; never shrinks.
template <class A>
inline A* scratch(int slot, int64_t n) {
    thread_local std::vector<A> bufs[6];
    auto& b = bufs[slot];
    if (int64_t(b.size()) < n) b.resize(size_t(n));
    return b.data();
}

// Pointer to n values of row `off` as A: in place when the layout matches, else converted.
template <class A>
inline const A* row_in(const TensorView& v, int64_t off, int64_t n, int slot) {
    int64_t st = last_stride(v);
    const char* p = v.bytes() + off;
    bool native = (sizeof(A) == 4 && v.dtype == DType::F32) || (sizeof(A) == 8 && v.dtype == DType::F64);
    if (native && st == int64_t(sizeof(A))) return reinterpret_cast<const A*>(p);
    A* buf = scratch<A>(slot, n);
    load_row(p, st, v.dtype, n, buf);
    return buf;
}

template <class A>
inline A* row_out(const TensorView& v, int64_t off, int64_t n, int slot) {
    int64_t st = last_stride(v);
    bool native = (sizeof(A) == 4 && v.dtype == DType::F32) || (sizeof(A) == 8 && v.dtype == DType::F64);
    if (native && st == int64_t(sizeof(A))) return reinterpret_cast<A*>(v.bytes() + off);
    return scratch<A>(slot, n);
}

// row_out for an output that may be accumulated into: with `acc`, a staged (non-native) row
// is first loaded with the current contents, so `out[i] += r` works in both cases.
template <class A>
inline A* row_out_acc(const TensorView& v, int64_t off, int64_t n, int slot, bool acc) {
    A* out = row_out<A>(v, off, n, slot);
    if (acc && reinterpret_cast<char*>(out) != v.bytes() + off) load_row(v.bytes() + off, last_stride(v), v.dtype, n, out);
    return out;
}

template <class A>
inline void row_commit(const TensorView& v, int64_t off, int64_t n, const A* buf) {
    char* p = v.bytes() + off;
    if (reinterpret_cast<const char*>(buf) == p) return;
    store_row(p, last_stride(v), v.dtype, n, buf);
}

// Ask for the next row early: hardware prefetchers stop at 4 KiB page boundaries, so
// row-at-a-time kernels over page-sized rows otherwise stall on every row start.
inline void prefetch_row(const TensorView& v, int64_t off, int64_t n) {
    const int64_t st = last_stride(v);
    if (st != dtype_size(v.dtype)) return;
    const char* p = v.bytes() + off;
    for (int64_t b = 0; b < n * st; b += 64) __builtin_prefetch(p + b, 0, 3);
}

// Temporary memory of one kernel call, freed at scope exit: from ctx.workspace (tracked by the
// engine under category workspace) when there is one, else from the heap. 64-byte aligned.
class KernelScratch {
   public:
    KernelScratch(const OpContext& ctx, size_t bytes) : ws_(ctx.workspace), bytes_((bytes + 63) / 64 * 64 + 64) {
        raw_ = ws_ ? ws_->alloc(bytes_) : std::malloc(bytes_);
        if (!raw_) throw KernelError("cpu kernel: out of memory allocating " + std::to_string(bytes_) + " bytes of scratch");
        const uintptr_t a = (reinterpret_cast<uintptr_t>(raw_) + 63) & ~uintptr_t(63);
        data_ = reinterpret_cast<void*>(a);
    }
    ~KernelScratch() {
        if (ws_) ws_->free(raw_, bytes_);
        else std::free(raw_);
    }
    KernelScratch(const KernelScratch&) = delete;
    KernelScratch& operator=(const KernelScratch&) = delete;
    template <class A>
    A* as() const {
        return static_cast<A*>(data_);
    }

   private:
    WorkspaceAllocator* ws_;
    size_t bytes_;
    void* raw_ = nullptr;
    void* data_ = nullptr;
};

// Split rows [0, rows) across threads when the work is large enough to pay for it: one
// contiguous range per thread, run on the unit pool (unit_pool.h), whose helpers poll between
// the many short calls of a forward only while the CPUs are otherwise idle; an OpenMP team
// either sleeps between calls (a wake per call) or polls whatever the load.
template <class F>
inline void parallel_rows(const OpContext& ctx, int64_t rows, int64_t work_per_row, F&& fn) {
    const int threads = ctx.threads > 0 ? ctx.threads : omp_get_max_threads();
    if (threads <= 1 || rows <= 1 || rows * work_per_row < 32768) {
        fn(int64_t(0), rows);
        return;
    }
    const int64_t nt = std::min<int64_t>(threads, rows);
    run_units(int(nt), nt, [&](int64_t t) { fn(rows * t / nt, rows * (t + 1) / nt); });
}

// Iterate rows of dst with the matching row offsets of `nsrc` views of dst's shape (offs[0] is
// dst's, offs[1 + i] is srcs[i]'s); when everything is contiguous and unbroadcast, use flat
// 4096-element blocks so short rows do not dominate the cost.
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

// True when the call computes in f64: an f64 destination (auxiliary f32 operands such as
// RoPE tables or norm weights are widened), or an integer destination fed from f64.
inline bool is_f64_call(const OpCall& c) {
    if (c.dst.dtype == DType::F64) return true;
    return !dtype_is_float(c.dst.dtype) && c.nsrc > 0 && c.src[0].dtype == DType::F64;
}

// ---- kernel entry points (one file per op family; forward and backward side by side) ----
void matmul_forward(const OpContext& ctx, const OpCall& c);
// MATMUL with a packed u8 weight (packed_matmul.cpp; matmul_forward sends those calls there).
void matmul_packed(const OpContext& ctx, const OpCall& c);
bool matmul_packed_supported(const OpCall& c);
void add_forward(const OpContext& ctx, const OpCall& c);
void mul_forward(const OpContext& ctx, const OpCall& c);
void scale_forward(const OpContext& ctx, const OpCall& c);
void silu_forward(const OpContext& ctx, const OpCall& c);
void swiglu_forward(const OpContext& ctx, const OpCall& c);
void copy_forward(const OpContext& ctx, const OpCall& c);
void rmsnorm_forward(const OpContext& ctx, const OpCall& c);
void softmax_forward(const OpContext& ctx, const OpCall& c);
void rope_forward(const OpContext& ctx, const OpCall& c);
void embedding_forward(const OpContext& ctx, const OpCall& c);
void gather_forward(const OpContext& ctx, const OpCall& c);
void scatter_forward(const OpContext& ctx, const OpCall& c);
void reduce_forward(const OpContext& ctx, const OpCall& c);  // SUM, MAX, NORM
void sdpa_forward(const OpContext& ctx, const OpCall& c);
void sdpa_kivi_forward(const OpContext& ctx, const OpCall& c);
void sdpa_qrows_forward(const OpContext& ctx, const OpCall& c);
void sdpa_quest_forward(const OpContext& ctx, const OpCall& c);
void quantize_forward(const OpContext& ctx, const OpCall& c);
void dequantize_forward(const OpContext& ctx, const OpCall& c);
void rmsnorm_backward(const OpContext& ctx, const OpCall& c);
void rope_backward(const OpContext& ctx, const OpCall& c);
void silu_backward(const OpContext& ctx, const OpCall& c);
void swiglu_backward(const OpContext& ctx, const OpCall& c);
void axpy_forward(const OpContext& ctx, const OpCall& c);
void embedding_backward(const OpContext& ctx, const OpCall& c);
void cross_entropy_forward(const OpContext& ctx, const OpCall& c);
void cross_entropy_backward(const OpContext& ctx, const OpCall& c);
void sdpa_backward(const OpContext& ctx, const OpCall& c);
void optimizer_step(const OpContext& ctx, const OpCall& c);
void grad_norm_sq_forward(const OpContext& ctx, const OpCall& c);

// Thread count a kernel will use (ctx.threads, else OpenMP's default).
inline int kernel_threads(const OpContext& ctx) { return ctx.threads > 0 ? ctx.threads : omp_get_max_threads(); }

// Byte offset of element i (row-major over all of v's dims).
inline int64_t elem_offset(const TensorView& v, int64_t i) {
    int64_t off = 0;
    for (int k = v.ndim - 1; k >= 0; --k) {
        off += (i % v.ne[k]) * v.nb[k];
        i /= v.ne[k];
    }
    return off;
}

// Read element i of an int32/int64 index view of any rank.
inline int64_t index_at(const TensorView& v, int64_t i) {
    const int64_t off = elem_offset(v, i);
    return v.dtype == DType::I64 ? *reinterpret_cast<const int64_t*>(v.bytes() + off)
                                 : int64_t(*reinterpret_cast<const int32_t*>(v.bytes() + off));
}

}  // namespace kv::cpu
