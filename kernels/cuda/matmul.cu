// MATMUL on CUDA through cuBLAS (f32, bf16, f16 inputs with f32 compute; f64).
// Row-major C[M,N] = A[M,K] B[K,N] is computed as column-major C^T = B^T A^T, so cuBLAS gets
// (B, A) in that order. Operands whose last two dims have no unit stride, and destinations
// that are not row-contiguous, are repacked into workspace first.
#include <cublas_v2.h>

#include <memory>
#include <mutex>
#include <vector>

#include "cuda_common.cuh"

namespace kv::cuda {

namespace {

const char* cublas_status_str(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
        default: return "error";
    }
}

#define KV_CUBLAS_CHECK(expr)                                                                               \
    do {                                                                                                    \
        cublasStatus_t kv_st_ = (expr);                                                                     \
        if (kv_st_ != CUBLAS_STATUS_SUCCESS)                                                                \
            throw KernelError(std::string("cuBLAS: ") + #expr + " failed: " + cublas_status_str(kv_st_) + \
                              " at " + __FILE__ + ":" + std::to_string(__LINE__));                          \
    } while (0)

cublasHandle_t handle_for_current_device() {
    static std::mutex mu;
    static std::vector<cublasHandle_t> handles;
    int dev = 0;
    KV_CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lk(mu);
    if (int(handles.size()) <= dev) handles.resize(size_t(dev) + 1, nullptr);
    if (!handles[size_t(dev)]) KV_CUBLAS_CHECK(cublasCreate(&handles[size_t(dev)]));
    return handles[size_t(dev)];
}

cudaDataType_t cuda_type(DType t) {
    switch (t) {
        case DType::F32: return CUDA_R_32F;
        case DType::F64: return CUDA_R_64F;
        case DType::F16: return CUDA_R_16F;
        case DType::BF16: return CUDA_R_16BF;
        default: throw KernelError("cuda matmul: unsupported dtype");
    }
}

// Workspace buffer (device memory, tracked by the engine).
struct DevBuf {
    const OpContext& ctx;
    void* p = nullptr;
    size_t bytes;
    DevBuf(const OpContext& c, size_t n) : ctx(c), bytes(n) {
        if (ctx.workspace) p = ctx.workspace->alloc(n);
        else KV_CUDA_CHECK(cudaMalloc(&p, n));
    }
    ~DevBuf() {
        if (ctx.workspace) ctx.workspace->free(p, bytes);
        else cudaFree(p);
    }
};

TensorView contiguous_like(const TensorView& v, void* buf) {
    TensorView r = v;
    r.data = buf;
    long long st = dtype_size(v.dtype);
    for (int i = v.ndim - 1; i >= 0; --i) {
        r.nb[i] = st;
        st *= v.ne[i];
    }
    return r;
}

void copy_view(const OpContext& ctx, const TensorView& dst, const TensorView& src) {
    OpCall c;
    c.op = OpKind::COPY;
    c.dst = dst;
    c.src[0] = src;
    c.nsrc = 1;
    elementwise_forward(ctx, c);
}

struct GemmOperand {
    const void* ptr;
    cublasOperation_t op;
    int ld;
};

// Describe a row-major [rows, cols] matrix view (element strides rs, cs) for cuBLAS, which
// will see its transpose in column-major form.
bool describe(const TensorView& v, int nd, GemmOperand* g) {
    long long es = dtype_size(v.dtype);
    long long rs = v.nb[nd - 2] / es, cs = v.nb[nd - 1] / es;
    long long rows = v.ne[nd - 2], cols = v.ne[nd - 1];
    if (cs == 1 || cols == 1) {  // row-major -> column-major transpose, no op
        g->op = CUBLAS_OP_N;
        g->ld = int(rows == 1 ? (cols > 0 ? cols : 1) : rs);
        if (g->ld < cols) g->ld = int(cols);
        return true;
    }
    if (rs == 1 || rows == 1) {  // column-major storage: transpose it back
        g->op = CUBLAS_OP_T;
        g->ld = int(cols == 1 ? (rows > 0 ? rows : 1) : cs);
        if (g->ld < rows) g->ld = int(rows);
        return true;
    }
    return false;
}

}  // namespace

void matmul_forward(const OpContext& ctx, const OpCall& c) {
    const TensorView& d0 = c.dst;
    TensorView a = c.src[0], b = c.src[1];
    const int nd = d0.ndim;
    const long long M = d0.ne[nd - 2], N = d0.ne[nd - 1], K = a.ne[nd - 1];
    if (d0.numel() == 0) return;

    // Repack operands cuBLAS cannot address.
    GemmOperand ga{}, gb{};
    std::unique_ptr<DevBuf> abuf, bbuf, dbuf;
    if (!describe(a, nd, &ga)) {
        abuf = std::make_unique<DevBuf>(ctx, size_t(a.numel()) * dtype_size(a.dtype));
        TensorView t = contiguous_like(a, abuf->p);
        copy_view(ctx, t, a);
        a = t;
        describe(a, nd, &ga);
    }
    if (!describe(b, nd, &gb)) {
        bbuf = std::make_unique<DevBuf>(ctx, size_t(b.numel()) * dtype_size(b.dtype));
        TensorView t = contiguous_like(b, bbuf->p);
        copy_view(ctx, t, b);
        b = t;
        describe(b, nd, &gb);
    }
    // Operands of two types go to f32 both: cuBLAS wants A and B of one type.
    if (a.dtype != b.dtype && a.dtype != DType::F64) {
        for (TensorView* x : {&a, &b}) {
            if (x->dtype == DType::F32) continue;
            std::unique_ptr<DevBuf>& buf = x == &a ? abuf : bbuf;
            GemmOperand& g = x == &a ? ga : gb;
            auto cast = std::make_unique<DevBuf>(ctx, size_t(x->numel()) * sizeof(float));
            TensorView t = *x;
            t.dtype = DType::F32;
            t = contiguous_like(t, cast->p);
            copy_view(ctx, t, *x);
            *x = t;
            buf = std::move(cast);
            describe(*x, nd, &g);
        }
    }
    TensorView d = d0;
    long long des = dtype_size(d.dtype);
    // cuBLAS with f32 compute takes f32 -> f32 and f16/bf16 -> the same type or f32 (cublasGemmEx's
    // table): an f32 product stored as f16/bf16 goes through an f32 workspace.
    const bool d_type_ok = d.dtype == a.dtype || d.dtype == DType::F32;
    bool d_ok = d_type_ok && (d.nb[nd - 1] == des || N == 1);
    if (!d_ok) {
        TensorView t = d0;
        if (!d_type_ok) t.dtype = DType::F32;
        des = dtype_size(t.dtype);
        dbuf = std::make_unique<DevBuf>(ctx, size_t(d.numel()) * des);
        d = contiguous_like(t, dbuf->p);
        if (c.p.beta != 0.0f) copy_view(ctx, d, d0);
    }
    int ldc = int(M == 1 ? N : d.nb[nd - 2] / des);
    if (ldc < N) ldc = int(N);

    cublasHandle_t h = handle_for_current_device();
    KV_CUBLAS_CHECK(cublasSetStream(h, stream_of(ctx)));
    const bool f64 = a.dtype == DType::F64;
    const double alpha64 = c.p.alpha, beta64 = c.p.beta;
    const float alpha32 = c.p.alpha, beta32 = c.p.beta;
    const void* alpha = f64 ? static_cast<const void*>(&alpha64) : static_cast<const void*>(&alpha32);
    const void* beta = f64 ? static_cast<const void*>(&beta64) : static_cast<const void*>(&beta32);
    cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;

    // Loop over batch indices (broadcast dims use stride 0).
    long long batches = d.numel() / (M * N);
    for (long long bi = 0; bi < batches; ++bi) {
        long long rem = bi, ao = 0, bo = 0, dof = 0;
        for (int k = nd - 3; k >= 0; --k) {
            long long idx = rem % d.ne[k];
            rem /= d.ne[k];
            ao += (a.ne[k] == 1 ? 0 : idx) * a.nb[k];
            bo += (b.ne[k] == 1 ? 0 : idx) * b.nb[k];
            dof += idx * d.nb[k];
        }
        KV_CUBLAS_CHECK(cublasGemmEx(h, gb.op, ga.op, int(N), int(M), int(K), alpha, b.bytes() + bo, cuda_type(b.dtype), gb.ld,
                                     a.bytes() + ao, cuda_type(a.dtype), ga.ld, beta, d.bytes() + dof, cuda_type(d.dtype), ldc,
                                     compute, CUBLAS_GEMM_DEFAULT));
    }
    if (dbuf) copy_view(ctx, d0, d);
}

}  // namespace kv::cuda
