// CPU backend: the single dispatch switch and supports_op table (forward ops, their
// gradients and the optimizer step).
#include "cpu_backend.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdlib>
#include <cstring>
#include <sys/mman.h>

#include "cpu_common.h"
#include "unit_pool.h"
#include "kernels/common/quant_formats.h"
#include "kernels/common/kivi_op.h"
#include "kernels/common/packed_blocks.h"
#include "kernels/common/qrows_op.h"
#include "kernels/common/quest_op.h"

#ifndef KVLAB_CPU_VARIANT_NAME
#define KVLAB_CPU_VARIANT_NAME "base"
#endif

// Each variant is really compiled for its ISA level: a -march later on the command line
// (interface options come after a target's own) would silently win and make every variant
// the baseline, or the baseline use instructions older CPUs lack.
#if defined(KVLAB_CPU_VARIANT_base) && (defined(__AVX__) || !defined(__SSE4_2__))
#error "the base CPU kernels must be compiled for x86-64-v2 (SSE4.2, no AVX)"
#endif
#if defined(KVLAB_CPU_VARIANT_avx2) && (!defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__) || defined(__AVX512F__))
#error "the avx2 CPU kernel variant must be compiled for x86-64-v3 (AVX2, FMA, F16C; no AVX-512)"
#endif
#if defined(KVLAB_CPU_VARIANT_avx512) && (!defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || defined(__AVX512BF16__))
#error "the avx512 CPU kernel variant must be compiled for x86-64-v4 (AVX-512 F/BW/VL) without BF16"
#endif
#if defined(KVLAB_CPU_VARIANT_avx512bf16) && (!defined(__AVX512F__) || !defined(__AVX512BF16__))
#error "the avx512bf16 CPU kernel variant must be compiled for x86-64-v4 + AVX512-BF16"
#endif

namespace kv {

namespace {

bool is_compute_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16; }
bool is_index(DType t) { return t == DType::I32 || t == DType::I64; }
// SDPA's / SDPA_BACKWARD's optional sink logits at source i: float (NH), NH = q's heads.
bool sinks_ok(const OpCall& c, int i) {
    const TensorView& s = c.src[i];
    return s.data && s.ndim == 1 && s.ne[0] == c.src[0].ne[1] && is_compute_float(s.dtype);
}

class CpuBackend final : public KernelBackend {
   public:
    const char* name() const override { return "cpu"; }
    DeviceType device_type() const override { return DeviceType::CPU; }
    int device_count() const override { return 1; }

    bool supports_op(const OpCall& c) const override {
        if (c.dst.device.type != DeviceType::CPU) return false;
        switch (c.op) {
            case OpKind::MATMUL:
                if (c.nsrc == 2 && c.src[1].dtype == DType::U8) return cpu::matmul_packed_supported(c);  // packed weight
                return c.nsrc == 2 && is_compute_float(c.src[0].dtype) && c.src[0].dtype == c.src[1].dtype &&
                       is_compute_float(c.dst.dtype) &&
                       ((c.src[0].dtype == DType::F64) == (c.dst.dtype == DType::F64));
            case OpKind::ADD:
            case OpKind::MUL:
            case OpKind::SWIGLU:
                return c.nsrc == 2 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype) &&
                       is_compute_float(c.src[1].dtype);
            case OpKind::SCALE:
            case OpKind::SILU:
            case OpKind::SOFTMAX:
                return c.nsrc == 1 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype);
            case OpKind::RMSNORM:
                return (c.nsrc == 1 || c.nsrc == 2) && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype);
            case OpKind::ROPE:
                return c.nsrc == 4 && is_compute_float(c.dst.dtype) && c.src[1].dtype == DType::I32 && c.dst.ndim == 4;
            case OpKind::EMBEDDING:
                return c.nsrc == 2 && (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::GATHER:
            case OpKind::SCATTER:
                return c.nsrc == 2 && (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::COPY:
                return c.nsrc == 1;
            case OpKind::SUM:
            case OpKind::MAX:
            case OpKind::NORM:
                return c.nsrc == 1 && is_compute_float(c.src[0].dtype) && is_compute_float(c.dst.dtype);
            case OpKind::SDPA:
                return (c.nsrc == 5 || (c.nsrc == 6 && sinks_ok(c, 5))) && c.dst.ndim == 4 && is_compute_float(c.src[0].dtype) &&
                       is_compute_float(c.src[1].dtype) &&
                       is_compute_float(c.src[2].dtype) && c.src[3].dtype == DType::I32 && c.src[4].dtype == DType::I32 &&
                       (c.dst2.data == nullptr || is_compute_float(c.dst2.dtype)) &&
                       (c.dst3.data == nullptr || c.dst3.dtype == DType::F32 || c.dst3.dtype == DType::F64);
            case OpKind::SDPA_KIVI:
                return kivi_call_ok(c);
            case OpKind::SDPA_QUEST:
                return quest_call_ok(c);
            case OpKind::SDPA_QROWS:
                return qrows_call_ok(c);
            case OpKind::QUANTIZE:
                return c.nsrc == 1 && is_compute_float(c.src[0].dtype) && c.dst.dtype == DType::U8 &&
                       c.p.qformat < int(QuantFormat::COUNT) && quant_row_ok(QuantFormat(c.p.qformat), c.src[0].last()) &&
                       c.dst.last() == quant_row_bytes(QuantFormat(c.p.qformat), c.src[0].last()) && cpu::last_stride(c.dst) == 1;
            case OpKind::DEQUANTIZE:
                return c.nsrc == 1 && is_compute_float(c.dst.dtype) && c.src[0].dtype == DType::U8 &&
                       c.p.qformat < int(QuantFormat::COUNT) && quant_row_ok(QuantFormat(c.p.qformat), c.dst.last()) &&
                       c.src[0].last() == quant_row_bytes(QuantFormat(c.p.qformat), c.dst.last()) && cpu::last_stride(c.src[0]) == 1;
            case OpKind::RMSNORM_BACKWARD:
                return (c.nsrc == 2 || c.nsrc == 3) && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype) &&
                       is_compute_float(c.src[1].dtype) && (!has_src(c, 2) || is_compute_float(c.src[2].dtype)) &&
                       (c.dst2.data == nullptr || (has_src(c, 2) && is_compute_float(c.dst2.dtype)));
            case OpKind::ROPE_BACKWARD:
                return c.nsrc == 4 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype) &&
                       c.src[1].dtype == DType::I32 && c.dst.ndim == 4;
            case OpKind::SILU_BACKWARD:
                return c.nsrc == 2 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype) && is_compute_float(c.src[1].dtype);
            case OpKind::SWIGLU_BACKWARD:
                return c.nsrc == 3 && is_compute_float(c.dst.dtype) && c.dst2.data && is_compute_float(c.dst2.dtype) &&
                       is_compute_float(c.src[0].dtype) && is_compute_float(c.src[1].dtype) && is_compute_float(c.src[2].dtype);
            case OpKind::EMBEDDING_BACKWARD:
                return c.nsrc == 2 && c.dst.ndim == 2 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype) &&
                       (c.src[1].dtype == DType::I32 || c.src[1].dtype == DType::I64);
            case OpKind::CROSS_ENTROPY:
            case OpKind::CROSS_ENTROPY_BACKWARD:
                return c.nsrc >= 2 && c.nsrc <= (c.op == OpKind::CROSS_ENTROPY ? 3 : 4) && is_compute_float(c.dst.dtype) &&
                       is_compute_float(c.src[0].dtype) && is_index(c.src[1].dtype) && (!has_src(c, 2) || is_index(c.src[2].dtype)) &&
                       (!has_src(c, 3) || is_compute_float(c.src[3].dtype));
            case OpKind::SDPA_BACKWARD:
                return (c.nsrc == 6 || (c.nsrc == 7 && sinks_ok(c, 6))) && c.dst.ndim == 4 && is_compute_float(c.dst.dtype) &&
                       is_compute_float(c.src[0].dtype) &&
                       (c.dst4.data == nullptr || (c.nsrc == 7 && c.dst4.ndim == 1 && c.dst4.ne[0] == c.src[0].ne[1] &&
                                                   is_compute_float(c.dst4.dtype))) &&
                       is_compute_float(c.src[1].dtype) && is_compute_float(c.src[2].dtype) && c.src[3].dtype == DType::I32 &&
                       c.src[4].dtype == DType::I32 && is_compute_float(c.src[5].dtype) && c.dst2.data && c.dst3.data &&
                       is_compute_float(c.dst2.dtype) && is_compute_float(c.dst3.dtype);
            case OpKind::AXPY:
                return c.nsrc == 1 && is_compute_float(c.dst.dtype) && is_compute_float(c.src[0].dtype);
            case OpKind::OPTIMIZER_STEP: {
                if (c.nsrc != 1 || !is_compute_float(c.dst.dtype) || !is_compute_float(c.src[0].dtype)) return false;
                const int need = optimizer_state_slots(c.p.opt);
                if (need < 0) return false;
                if ((need >= 1) != (c.dst2.data != nullptr) || (need >= 2) != (c.dst3.data != nullptr)) return false;
                return (!c.dst2.data || is_compute_float(c.dst2.dtype)) && (!c.dst3.data || is_compute_float(c.dst3.dtype));
            }
            case OpKind::GRAD_NORM_SQ:
                return c.nsrc == 1 && is_compute_float(c.src[0].dtype) && is_compute_float(c.dst.dtype) && c.dst.numel() == 1;
            default:
                return false;
        }
    }

    void compute(const OpContext& ctx, const OpCall& c) override {
        switch (c.op) {
            case OpKind::MATMUL: cpu::matmul_forward(ctx, c); break;
            case OpKind::ADD: cpu::add_forward(ctx, c); break;
            case OpKind::MUL: cpu::mul_forward(ctx, c); break;
            case OpKind::SCALE: cpu::scale_forward(ctx, c); break;
            case OpKind::RMSNORM: cpu::rmsnorm_forward(ctx, c); break;
            case OpKind::SOFTMAX: cpu::softmax_forward(ctx, c); break;
            case OpKind::SILU: cpu::silu_forward(ctx, c); break;
            case OpKind::SWIGLU: cpu::swiglu_forward(ctx, c); break;
            case OpKind::ROPE: cpu::rope_forward(ctx, c); break;
            case OpKind::EMBEDDING: cpu::embedding_forward(ctx, c); break;
            case OpKind::GATHER: cpu::gather_forward(ctx, c); break;
            case OpKind::SCATTER: cpu::scatter_forward(ctx, c); break;
            case OpKind::COPY: cpu::copy_forward(ctx, c); break;
            case OpKind::SUM:
            case OpKind::MAX:
            case OpKind::NORM: cpu::reduce_forward(ctx, c); break;
            case OpKind::SDPA: cpu::sdpa_forward(ctx, c); break;
            case OpKind::SDPA_KIVI: cpu::sdpa_kivi_forward(ctx, c); break;
            case OpKind::SDPA_QUEST: cpu::sdpa_quest_forward(ctx, c); break;
            case OpKind::SDPA_QROWS: cpu::sdpa_qrows_forward(ctx, c); break;
            case OpKind::QUANTIZE: cpu::quantize_forward(ctx, c); break;
            case OpKind::DEQUANTIZE: cpu::dequantize_forward(ctx, c); break;
            case OpKind::RMSNORM_BACKWARD: cpu::rmsnorm_backward(ctx, c); break;
            case OpKind::ROPE_BACKWARD: cpu::rope_backward(ctx, c); break;
            case OpKind::SILU_BACKWARD: cpu::silu_backward(ctx, c); break;
            case OpKind::SWIGLU_BACKWARD: cpu::swiglu_backward(ctx, c); break;
            case OpKind::EMBEDDING_BACKWARD: cpu::embedding_backward(ctx, c); break;
            case OpKind::CROSS_ENTROPY: cpu::cross_entropy_forward(ctx, c); break;
            case OpKind::CROSS_ENTROPY_BACKWARD: cpu::cross_entropy_backward(ctx, c); break;
            case OpKind::SDPA_BACKWARD: cpu::sdpa_backward(ctx, c); break;
            case OpKind::AXPY: cpu::axpy_forward(ctx, c); break;
            case OpKind::OPTIMIZER_STEP: cpu::optimizer_step(ctx, c); break;
            case OpKind::GRAD_NORM_SQ: cpu::grad_norm_sq_forward(ctx, c); break;
            default: throw KernelError(std::string("cpu backend: op ") + op_kind_name(c.op) + " is not implemented");
        }
    }

    void* alloc(int, size_t bytes) override {
        // 64-byte alignment for AVX-512 loads. Large buffers (weights, KV caches, long
        // activations) are streamed end to end by decode: 2 MiB-aligned and marked for
        // transparent huge pages (THP "madvise" mode), so a pass over them takes one TLB miss
        // per 2 MiB instead of per 4 KiB wherever a whole 2 MiB extent fits (the size is not
        // rounded up: a tail under 2 MiB stays in small pages, no memory is wasted).
        // qwen2.5-0.5b bf16 decode: ~11% faster per token, measured interleaved.
        const bool huge = bytes >= kHugePage;
        void* p = nullptr;
        if (posix_memalign(&p, huge ? kHugePage : 64, bytes ? bytes : 64) != 0) p = nullptr;
        if (!p) throw KernelError("cpu backend: out of host memory allocating " + std::to_string(bytes) + " bytes");
#if defined(MADV_HUGEPAGE)
        if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // advisory: ignored where THP is off
#endif
        return p;
    }
    static constexpr size_t kHugePage = size_t(2) << 20;
    void free(int, void* p) override { std::free(p); }
    void copy_h2d(int, void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void copy_d2h(int, void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    void copy_d2d(int, void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
    std::string build_info() const override {
        const dnnl_version_t* v = dnnl_version();
        return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
               " (" + (v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime") + "), kernels " + KVLAB_CPU_VARIANT_NAME;
    }
    std::string kernel_variant() const override { return KVLAB_CPU_VARIANT_NAME; }
    void run_host_units(int threads, int64_t units, void (*fn)(void*, int64_t), void* ctx) override {
        cpu::run_units(threads, units, fn, ctx);
    }
    int preferred_packed_format(int format) const override {
#if defined(__AVX2__) && !defined(__AVX512F__)
        // AVX2 decode reads Q4_1 as a column of 8 rows per vector (packed_matmul.cpp), faster than
        // the row-by-row kernel (docs/PERFORMANCE.md). AVX-512 keeps its 16-lane table kernel.
        if (format == int(PackedFormat::Q4_1)) return int(PackedFormat::Q4_1_R16);
#endif
        return format;
    }
    std::string impl_info() const override { return cpu::matmul_impl_info(); }
};

}  // namespace

KernelBackend& cpu_kernel_backend() {
    static CpuBackend backend;
    return backend;
}

}  // namespace kv

#if defined(KVLAB_CPU_VARIANT_MODULE)
// The one symbol a variant library exports (everything else is hidden, so two variants and
// the built-in base never share an inline function or template compiled for another ISA).
extern "C" __attribute__((visibility("default"))) kv::KernelBackend* kvlab_cpu_backend_create() {
    return &kv::cpu_kernel_backend();
}
#endif
