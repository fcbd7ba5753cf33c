// The small interface every compute backend implements (CPU in-process, CUDA as a plugin
// library loaded at run time so a CPU-only machine never needs the CUDA runtime).
// Methods marked "optional" have the default shown.
#pragma once

#include <string>

#include "op.h"

namespace kv {

class KernelBackend {
   public:
    virtual ~KernelBackend() = default;

    // Short name used in logs and test names: "cpu", "cuda".
    virtual const char* name() const = 0;
    // The device type this backend computes on.
    virtual DeviceType device_type() const = 0;
    // Number of usable devices; 0 means the backend is built but cannot run here.
    virtual int device_count() const = 0;
    // Why device_count() is 0 (optional; default: empty).
    virtual std::string unavailable_reason() const { return {}; }

    // Whether compute() handles this call (dtypes, layouts, sizes).
    virtual bool supports_op(const OpCall& call) const = 0;
    // Run one op. Throws KernelError on unsupported calls or device errors.
    virtual void compute(const OpContext& ctx, const OpCall& call) = 0;

    // Raw device memory; the engine's tracked allocator is the only caller.
    virtual void* alloc(int device, size_t bytes) = 0;
    virtual void free(int device, void* p) = 0;
    // Copies between host memory and this backend's device memory (or within the device).
    virtual void copy_h2d(int device, void* dst, const void* src, size_t bytes) = 0;
    virtual void copy_d2h(int device, void* dst, const void* src, size_t bytes) = 0;
    virtual void copy_d2d(int device, void* dst, const void* src, size_t bytes) = 0;
    // Host -> device copy meant to run on a copy thread while compute continues (offload
    // prefetch): returns when the bytes have arrived, without ordering against the compute
    // queue (CUDA: a non-blocking copy stream). Default: the ordinary copy.
    virtual void copy_h2d_side(int device, void* dst, const void* src, size_t bytes) { copy_h2d(device, dst, src, bytes); }
    // Wait for outstanding work (optional; default: nothing to wait for).
    virtual void synchronize(int /*device*/) {}
    // One line describing the build (library versions, architectures) (optional).
    virtual std::string build_info() const { return {}; }
    // CPU: the kernel variant this instance was compiled for ("avx512bf16", "avx512",
    // "avx2", "base"); empty for other backends (optional).
    virtual std::string kernel_variant() const { return {}; }
    // The packed layout (a PackedFormat value, packed_blocks.h) this backend multiplies
    // fastest for weights stored as `format`; the GGUF loader regroups them in place when it
    // differs (optional; default: as stored).
    virtual int preferred_packed_format(int format) const { return format; }
    // Library implementations used so far, for benchmark reports, e.g. oneDNN's
    // "brg:avx512_core" (optional).
    virtual std::string impl_info() const { return {}; }
    // Host work of the engine (fused row passes, policy scoring): fn(ctx, u) for every u in
    // [0, units) on up to `threads` threads, returning when all have returned; fn must not
    // throw, and results must not depend on which thread ran a unit. CPU: the kernels' unit
    // pool, so host passes and kernels share one set of threads. Default: in order, here.
    virtual void run_host_units(int threads, int64_t units, void (*fn)(void* ctx, int64_t unit), void* ctx) {
        (void)threads;
        for (int64_t u = 0; u < units; ++u) fn(ctx, u);
    }
};

}  // namespace kv

// Entry point exported by the CUDA plugin library (libkvlab_cuda.so).
extern "C" kv::KernelBackend* kvlab_cuda_backend_create();
// Entry point exported by each CPU kernel variant library (libkvlab_cpu_<variant>.so): the
// CPU backend compiled for one ISA level (kernels/CMakeLists.txt), chosen at start-up.
extern "C" kv::KernelBackend* kvlab_cpu_backend_create();
