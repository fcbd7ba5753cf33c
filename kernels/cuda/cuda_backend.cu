// CUDA backend plugin: the dispatch switch, supports_op, device memory and copies.
// Built as libkvlab_cuda.so and loaded by the engine with dlopen, so nothing else links CUDA.
// Implements: every op of kernels/common/op.h for f32/bf16/f16 (f32 compute) and f64,
// gradients and optimizer steps included; gradients accumulated with atomics (embedding table,
// SDPA dk/dv) need f32 (f64) outputs.
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_common.cuh"
#include "device_pool.h"
#include "kernels/common/backend_iface.h"
#include "kernels/common/kivi_op.h"
#include "kernels/common/quest_op.h"

namespace kv::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
    throw KernelError(std::string("CUDA error ") + std::to_string(int(err)) + " (" + cudaGetErrorString(err) + ") in " + expr +
                      " at " + file + ":" + std::to_string(line));
}

namespace {

bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }

class CudaBackend final : public KernelBackend {
   public:
    CudaBackend() {
        int n = 0;  // cudaGetDeviceCount leaves the count untouched on error (e.g. 35: no driver)
        cudaError_t err = cudaGetDeviceCount(&n);
        if (err != cudaSuccess) {
            count_ = 0;
            reason_ = std::string("cudaGetDeviceCount failed with error ") + std::to_string(int(err)) + " (" +
                      cudaGetErrorString(err) + ")";
            cudaGetLastError();  // clear the sticky error state
        } else if (n <= 0) {
            count_ = 0;
            reason_ = "no CUDA device found";
        } else {
            count_ = n;
        }
    }
    const char* name() const override { return "cuda"; }
    DeviceType device_type() const override { return DeviceType::CUDA; }
    int device_count() const override { return count_; }
    std::string unavailable_reason() const override { return reason_; }

    bool supports_op(const OpCall& c) const override {
        if (c.dst.device.type != DeviceType::CUDA) return false;
        switch (c.op) {
            case OpKind::MATMUL:
                return c.nsrc == 2 && is_float(c.src[0].dtype) && c.src[0].dtype == c.src[1].dtype && is_float(c.dst.dtype) &&
                       ((c.src[0].dtype == DType::F64) == (c.dst.dtype == DType::F64));
            case OpKind::ADD:
            case OpKind::MUL:
            case OpKind::SWIGLU: return c.nsrc == 2 && is_float(c.dst.dtype) && c.p.act == int(GateAct::SILU);  // no GELU-tanh kernel yet
            case OpKind::SCALE:
            case OpKind::SILU:
            case OpKind::SOFTMAX: return c.nsrc == 1 && is_float(c.dst.dtype);
            case OpKind::RMSNORM: return (c.nsrc == 1 || c.nsrc == 2) && is_float(c.dst.dtype);
            case OpKind::ROPE: return c.nsrc == 4 && c.dst.ndim == 4 && c.src[1].dtype == DType::I32;
            case OpKind::EMBEDDING:
            case OpKind::GATHER:
            case OpKind::SCATTER: return c.nsrc == 2 && (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::COPY: return c.nsrc == 1;
            case OpKind::SUM:
            case OpKind::MAX:
            case OpKind::NORM: return c.nsrc == 1 && is_float(c.src[0].dtype);
            case OpKind::SDPA:
                return c.nsrc == 5 && c.dst.ndim == 4 && c.src[0].ne[3] <= 256 && c.src[3].dtype == DType::I32 &&
                       c.src[4].dtype == DType::I32 && c.dst3.data == nullptr &&  // no log-sum-exp output (CPU only)
                       c.p.softcap == 0.0f;                                          // no soft-capping (CPU only)
            case OpKind::SDPA_KIVI: return kivi_call_ok(c) && c.src[0].ne[3] <= 256;
            case OpKind::SDPA_QUEST: return quest_call_ok(c) && c.nsrc == 7 && sdpa_quest_fits(c);  // no sinks (CPU only)
            case OpKind::QUANTIZE:
                return c.nsrc == 1 && c.dst.dtype == DType::U8 && c.src[0].ne[c.src[0].ndim - 1] <= 4096 &&
                       c.dst.nb[c.dst.ndim - 1] == 1;
            case OpKind::DEQUANTIZE:
                return c.nsrc == 1 && c.src[0].dtype == DType::U8 && c.dst.ne[c.dst.ndim - 1] <= 4096 &&
                       c.src[0].nb[c.src[0].ndim - 1] == 1;
            case OpKind::RMSNORM_BACKWARD:
                return (c.nsrc == 2 || c.nsrc == 3) && is_float(c.dst.dtype) && is_float(c.src[0].dtype) && is_float(c.src[1].dtype) &&
                       (c.dst2.data == nullptr || (has_src(c, 2) && is_float(c.dst2.dtype)));
            case OpKind::ROPE_BACKWARD: return c.nsrc == 4 && c.dst.ndim == 4 && c.src[1].dtype == DType::I32 && is_float(c.dst.dtype);
            case OpKind::SILU_BACKWARD: return c.nsrc == 2 && is_float(c.dst.dtype);
            case OpKind::SWIGLU_BACKWARD:
                return c.nsrc == 3 && is_float(c.dst.dtype) && c.dst2.data && is_float(c.dst2.dtype) && c.p.act == int(GateAct::SILU);
            case OpKind::AXPY: return c.nsrc == 1 && is_float(c.dst.dtype) && is_float(c.src[0].dtype);
            case OpKind::EMBEDDING_BACKWARD:  // atomics: f32/f64 tables only
                return c.nsrc == 2 && c.dst.ndim == 2 && (c.dst.dtype == DType::F32 || c.dst.dtype == DType::F64) &&
                       (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::CROSS_ENTROPY:
            case OpKind::CROSS_ENTROPY_BACKWARD:
                return c.nsrc >= 2 && c.nsrc <= (c.op == OpKind::CROSS_ENTROPY ? 3 : 4) && is_float(c.dst.dtype) &&
                       is_float(c.src[0].dtype) && (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::SDPA_BACKWARD: {  // atomics: dk/dv f32 (f64 for f64 calls)
                const DType acc = c.dst.dtype == DType::F64 ? DType::F64 : DType::F32;
                return c.nsrc == 6 && c.dst.ndim == 4 && c.src[0].ne[3] <= 256 && c.src[3].dtype == DType::I32 &&
                       c.src[4].dtype == DType::I32 && is_float(c.dst.dtype) && c.dst2.data && c.dst3.data && c.dst2.dtype == acc &&
                       c.dst3.dtype == acc && c.p.softcap == 0.0f;
            }
            case OpKind::OPTIMIZER_STEP: {
                if (c.nsrc != 1 || !is_float(c.dst.dtype) || !is_float(c.src[0].dtype)) return false;
                const int need = optimizer_state_slots(c.p.opt);
                return need >= 0 && (need >= 1) == (c.dst2.data != nullptr) && (need >= 2) == (c.dst3.data != nullptr);
            }
            case OpKind::GRAD_NORM_SQ: return c.nsrc == 1 && is_float(c.src[0].dtype) && is_float(c.dst.dtype) && c.dst.numel() == 1;
            default: return false;
        }
    }

    void compute(const OpContext& ctx, const OpCall& c) override {
        KV_CUDA_CHECK(cudaSetDevice(c.dst.device.index));
        switch (c.op) {
            case OpKind::MATMUL: matmul_forward(ctx, c); break;
            case OpKind::ADD:
            case OpKind::MUL:
            case OpKind::SCALE:
            case OpKind::SILU:
            case OpKind::SWIGLU:
            case OpKind::COPY: elementwise_forward(ctx, c); break;
            case OpKind::RMSNORM: rmsnorm_forward(ctx, c); break;
            case OpKind::SOFTMAX: softmax_forward(ctx, c); break;
            case OpKind::ROPE: rope_forward(ctx, c); break;
            case OpKind::EMBEDDING: embedding_forward(ctx, c); break;
            case OpKind::GATHER: gather_forward(ctx, c); break;
            case OpKind::SCATTER: scatter_forward(ctx, c); break;
            case OpKind::SUM:
            case OpKind::MAX:
            case OpKind::NORM: reduce_forward(ctx, c); break;
            case OpKind::SDPA: sdpa_forward(ctx, c); break;
            case OpKind::SDPA_KIVI: sdpa_kivi_forward(ctx, c); break;
            case OpKind::SDPA_QUEST: sdpa_quest_forward(ctx, c); break;
            case OpKind::QUANTIZE: quantize_forward(ctx, c); break;
            case OpKind::DEQUANTIZE: dequantize_forward(ctx, c); break;
            case OpKind::RMSNORM_BACKWARD: rmsnorm_backward(ctx, c); break;
            case OpKind::ROPE_BACKWARD: rope_backward(ctx, c); break;
            case OpKind::SILU_BACKWARD:
            case OpKind::SWIGLU_BACKWARD:
            case OpKind::AXPY: elementwise_backward(ctx, c); break;
            case OpKind::EMBEDDING_BACKWARD: embedding_backward(ctx, c); break;
            case OpKind::CROSS_ENTROPY: cross_entropy_forward(ctx, c); break;
            case OpKind::CROSS_ENTROPY_BACKWARD: cross_entropy_backward(ctx, c); break;
            case OpKind::SDPA_BACKWARD: sdpa_backward(ctx, c); break;
            case OpKind::OPTIMIZER_STEP: optimizer_step(ctx, c); break;
            case OpKind::GRAD_NORM_SQ: grad_norm_sq_forward(ctx, c); break;
            default: throw KernelError(std::string("cuda backend: op ") + op_kind_name(c.op) + " is not implemented");
        }
    }

    void* alloc(int device, size_t bytes) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        return pool(device).alloc(bytes, [](cudaError_t e, const char* what) { throw_cuda_error(e, what, __FILE__, __LINE__); });
    }
    void free(int device, void* p) override {
        cudaSetDevice(device);
        pool(device).free(p);
    }
    void copy_h2d(int device, void* dst, const void* src, size_t bytes) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        KV_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    }
    // A non-blocking stream per calling thread: the copy does not wait for (or hold up) the
    // kernels on the legacy default stream, so a prefetch overlaps the layer being computed.
    // Pageable host memory makes the DMA go through the driver's staging buffers; the calling
    // thread blocks for that, which is why it is a copy thread and not the compute thread.
    void copy_h2d_side(int device, void* dst, const void* src, size_t bytes) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        thread_local cudaStream_t side = nullptr;
        if (!side) KV_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
        KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, side));
        KV_CUDA_CHECK(cudaStreamSynchronize(side));
    }
    void copy_d2h(int device, void* dst, const void* src, size_t bytes) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        KV_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    }
    void copy_d2d(int device, void* dst, const void* src, size_t bytes) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        KV_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    }
    void synchronize(int device) override {
        KV_CUDA_CHECK(cudaSetDevice(device));
        KV_CUDA_CHECK(cudaDeviceSynchronize());
    }
    std::string build_info() const override {
        int rt = 0;
        cudaRuntimeGetVersion(&rt);
        return "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string((rt % 1000) / 10) + ", cuBLAS";
    }

   private:
    DevicePool& pool(int device) {
        std::lock_guard<std::mutex> lk(pools_mu_);
        if (int(pools_.size()) <= device) pools_.resize(size_t(device) + 1);
        if (!pools_[size_t(device)]) pools_[size_t(device)] = std::make_unique<DevicePool>(device);
        return *pools_[size_t(device)];
    }

    int count_ = 0;
    std::string reason_;
    std::mutex pools_mu_;
    std::vector<std::unique_ptr<DevicePool>> pools_;  // never destroyed before the process ends
};

}  // namespace
}  // namespace kv::cuda

extern "C" kv::KernelBackend* kvlab_cuda_backend_create() { return new kv::cuda::CudaBackend(); }
