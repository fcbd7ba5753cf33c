// Shared pieces of the CUDA kernels: error checks, strided element access, dtype load/store
// (the same conversions as the CPU through kernels/common/dtype.h), launch helpers.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/common/element_math.h"
#include "kernels/common/op.h"

namespace kv::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

#define KV_CUDA_CHECK(expr)                                                              \
    do {                                                                                 \
        cudaError_t kv_err_ = (expr);                                                    \
        if (kv_err_ != cudaSuccess) ::kv::cuda::throw_cuda_error(kv_err_, #expr, __FILE__, __LINE__); \
    } while (0)

// Check after every kernel launch (launch errors are reported asynchronously otherwise).
#define KV_CUDA_CHECK_LAUNCH() KV_CUDA_CHECK(cudaGetLastError())

inline cudaStream_t stream_of(const OpContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

inline unsigned blocks_for(long long n, int threads) {
    long long b = (n + threads - 1) / threads;
    return unsigned(b < 65535LL * 16 ? (b > 0 ? b : 1) : 65535LL * 16);
}

// Byte offset of linear element `i` (row-major over v.ne) in view v. Loops over a view's dims
// are unrolled over KV_MAX_DIMS (skipping k >= ndim) so ne/nb are read at constant offsets: a
// loop bounded by v.ndim indexes the kernel's parameter struct at run time, and every thread
// then copies the struct to local memory first (elementwise kernels ran 40x under the copy
// rate on an H200, docs/GPU.md). Every kernel's dimension loop follows this pattern.
__device__ __forceinline__ long long elem_offset(const TensorView& v, long long i) {
    long long off = 0;
#pragma unroll
    for (int k = KV_MAX_DIMS - 1; k >= 0; --k) {
        if (k >= v.ndim) continue;
        long long idx = i % v.ne[k];
        i /= v.ne[k];
        off += idx * v.nb[k];
    }
    return off;
}

// numel(), the last dim's size and stride, unrolled like elem_offset (device code only).
__device__ __forceinline__ long long dev_numel(const TensorView& v) {
    long long n = 1;
#pragma unroll
    for (int k = 0; k < KV_MAX_DIMS; ++k)
        if (k < v.ndim) n *= v.ne[k];
    return n;
}
__device__ __forceinline__ long long last_of(const TensorView& v, const int64_t (&a)[KV_MAX_DIMS], long long none) {
    long long r = none;
#pragma unroll
    for (int k = 0; k < KV_MAX_DIMS; ++k)
        if (k == v.ndim - 1) r = a[k];
    return r;
}
__device__ __forceinline__ long long last_ne(const TensorView& v) { return last_of(v, v.ne, 1); }
__device__ __forceinline__ long long last_nb(const TensorView& v) { return last_of(v, v.nb, 0); }

// Byte offset of row r (row-major over all dims but the last) in view v. Rows are block
// indices and dims fit 32 bits: 32-bit division, inline (64-bit division is a call, and the
// call made the row kernels copy their views to local memory anyway).
__device__ __forceinline__ long long row_offset(const TensorView& v, long long r) {
    long long off = 0;
    unsigned rr = unsigned(r);
#pragma unroll
    for (int k = KV_MAX_DIMS - 2; k >= 0; --k) {
        if (k > v.ndim - 2) continue;
        const unsigned n = unsigned(v.ne[k]);
        off += (long long)(rr % n) * v.nb[k];
        rr /= n;
    }
    return off;
}

template <class A>
__device__ __forceinline__ A load_elem(const char* p, DType dt) {
    switch (dt) {
        case DType::F32: return A(*reinterpret_cast<const float*>(p));
        case DType::F64: return A(*reinterpret_cast<const double*>(p));
        case DType::F16: return A(f16_to_f32(*reinterpret_cast<const uint16_t*>(p)));
        case DType::BF16: return A(bf16_to_f32(*reinterpret_cast<const uint16_t*>(p)));
        case DType::I32: return A(*reinterpret_cast<const int32_t*>(p));
        case DType::I64: return A(*reinterpret_cast<const long long*>(p));
        case DType::U8: return A(*reinterpret_cast<const uint8_t*>(p));
        default: return A(0);
    }
}

template <class A>
__device__ __forceinline__ void store_elem(char* p, DType dt, A x) {
    switch (dt) {
        case DType::F32: *reinterpret_cast<float*>(p) = float(x); break;
        case DType::F64: *reinterpret_cast<double*>(p) = double(x); break;
        case DType::F16: *reinterpret_cast<uint16_t*>(p) = f32_to_f16(float(x)); break;
        case DType::BF16: *reinterpret_cast<uint16_t*>(p) = f32_to_bf16(float(x)); break;
        case DType::I32: *reinterpret_cast<int32_t*>(p) = int32_t(x); break;
        case DType::I64: *reinterpret_cast<long long*>(p) = (long long)(x); break;
        case DType::U8: *reinterpret_cast<uint8_t*>(p) = uint8_t(x); break;
        default: break;
    }
}

__device__ __forceinline__ long long load_index(const char* p, DType dt) {
    return dt == DType::I64 ? *reinterpret_cast<const long long*>(p) : (long long)*reinterpret_cast<const int32_t*>(p);
}

// Host: `s` seen with `d`'s sizes (size-1 dims broadcast with stride 0).
inline TensorView broadcast_to(const TensorView& s, const TensorView& d) {
    TensorView r = s;
    for (int i = 0; i < d.ndim; ++i) {
        if (s.ne[i] != d.ne[i]) r.nb[i] = 0;
        r.ne[i] = d.ne[i];
    }
    return r;
}

// Same rule as the CPU: f64 destination (or integer destination fed from f64) computes in f64.
inline bool is_f64_call(const OpCall& c) {
    if (c.dst.dtype == DType::F64) return true;
    return !dtype_is_float(c.dst.dtype) && c.nsrc > 0 && c.src[0].dtype == DType::F64;
}

// Device memory for one call: from ctx.workspace (tracked by the engine) or cudaMalloc. The
// destructor does not wait for the kernels still using it: the engine's workspace ends in the
// backend's DevicePool, which hands a freed block out again only once an event recorded at the
// free (on the legacy default stream, where every kernel runs) has completed, and cudaFree
// waits for the device itself. (A stream synchronisation here cost every SDPA call a host
// round trip: one per layer and token in decode, docs/GPU.md.)
class DeviceScratch {
   public:
    DeviceScratch(const OpContext& ctx, size_t bytes) : ctx_(ctx), bytes_(bytes ? bytes : 1) {
        if (ctx_.workspace) p_ = ctx_.workspace->alloc(bytes_);
        else KV_CUDA_CHECK(cudaMalloc(&p_, bytes_));
    }
    ~DeviceScratch() {
        if (ctx_.workspace) ctx_.workspace->free(p_, bytes_);
        else cudaFree(p_);
    }
    DeviceScratch(const DeviceScratch&) = delete;
    DeviceScratch& operator=(const DeviceScratch&) = delete;
    template <class T>
    T* as() const {
        return static_cast<T*>(p_);
    }

   private:
    const OpContext& ctx_;
    size_t bytes_;
    void* p_ = nullptr;
};

// atomicAdd into an f32 or f64 element (gradients accumulated from many threads).
template <class A>
__device__ __forceinline__ void atomic_add_elem(char* p, DType dt, A v) {
    if (dt == DType::F64) atomicAdd(reinterpret_cast<double*>(p), double(v));
    else atomicAdd(reinterpret_cast<float*>(p), float(v));
}

// Zero every element of v (a gradient about to be accumulated into with atomics).
void zero_view(const OpContext& ctx, const TensorView& v);

// ---- kernel entry points (one .cu per op family, matching kernels/cpu) --------------------
void matmul_forward(const OpContext& ctx, const OpCall& c);
void elementwise_forward(const OpContext& ctx, const OpCall& c);  // ADD MUL SCALE SILU SWIGLU COPY
void rmsnorm_forward(const OpContext& ctx, const OpCall& c);
void softmax_forward(const OpContext& ctx, const OpCall& c);
void rope_forward(const OpContext& ctx, const OpCall& c);
void embedding_forward(const OpContext& ctx, const OpCall& c);
void gather_forward(const OpContext& ctx, const OpCall& c);
void scatter_forward(const OpContext& ctx, const OpCall& c);
void reduce_forward(const OpContext& ctx, const OpCall& c);  // SUM MAX NORM
void sdpa_forward(const OpContext& ctx, const OpCall& c);
void sdpa_kivi_forward(const OpContext& ctx, const OpCall& c);
void sdpa_quest_forward(const OpContext& ctx, const OpCall& c);
bool sdpa_quest_fits(const OpCall& c);
void quantize_forward(const OpContext& ctx, const OpCall& c);
void dequantize_forward(const OpContext& ctx, const OpCall& c);
void rmsnorm_backward(const OpContext& ctx, const OpCall& c);
void rope_backward(const OpContext& ctx, const OpCall& c);
void elementwise_backward(const OpContext& ctx, const OpCall& c);  // SILU_BACKWARD SWIGLU_BACKWARD AXPY
void embedding_backward(const OpContext& ctx, const OpCall& c);
void cross_entropy_forward(const OpContext& ctx, const OpCall& c);
void cross_entropy_backward(const OpContext& ctx, const OpCall& c);
void sdpa_backward(const OpContext& ctx, const OpCall& c);
void optimizer_step(const OpContext& ctx, const OpCall& c);
void grad_norm_sq_forward(const OpContext& ctx, const OpCall& c);

}  // namespace kv::cuda
