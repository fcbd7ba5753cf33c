// Which compute backends exist in this process, and the device memory entry points the
// tracked allocator uses. The CPU backend is always present; the CUDA backend is a plugin
// library (libkvlab_cuda.so) loaded on first use, so a CPU-only machine never loads CUDA.
#pragma once

#include <string>
#include <vector>

#include "kernels/common/backend_iface.h"
#include "kernels/cpu/cpu_variants.h"

namespace kv {

// The CPU backend of the kernel variant chosen at start-up (see cpu_variant_status()).
KernelBackend& cpu_backend();

// ---- CPU kernel variants ----------------------------------------------------------------
// The hot CPU kernels are compiled once per ISA level; the built-in "base" variant (the
// build's own flags) is always there, the others are libraries (libkvlab_cpu_<name>.so)
// next to the executable or in ../lib/kvlab. At start-up the best variant the CPU runs is
// chosen; KVLAB_CPU_VARIANT=<name> forces one (refused with a clear error if the CPU lacks
// its instructions or it was not built).
using CpuVariant = cpu::VariantInfo;
// Every variant this build knows, best first.
std::vector<CpuVariant> cpu_variants();
// The backend of one variant, or nullptr when the CPU cannot run it or it is not built
// (tests run every kernel variant the CPU can execute).
KernelBackend* cpu_variant_backend(const std::string& name);
// One line: "avx2 (best this CPU runs; avx512: CPU lacks avx512f ...)" or
// "base (forced by KVLAB_CPU_VARIANT)".
std::string cpu_variant_status();
// The CUDA backend if the plugin was built and loads; nullptr otherwise (see cuda_status()).
KernelBackend* cuda_backend();
// True when the CUDA plugin loaded and reports at least one device.
bool cuda_available();
// One line: "built, 1 device", "not built (KVLAB_CUDA=OFF)", "built, no usable device: ...".
std::string cuda_status();
// cuda_status() if the plugin was already loaded, else a line saying so. Loading it maps the
// CUDA libraries (~60 MiB resident for cuBLASLt alone), which a CPU run must not pay for.
std::string cuda_status_if_loaded();
// The raw CUDA error behind a "built, no ..." status (empty otherwise).
std::string cuda_status_detail();

// The backend computing on `device`; throws kv::Error naming the device if it is unusable.
KernelBackend& backend_for(Device device);

// Raw device memory (called by MemoryTracker only).
void* device_alloc(Device device, size_t bytes);
void device_free(Device device, void* ptr);

// CPU worker threads for kernels (OpenMP, also used by oneDNN). 0 = all cores.
// Throws kv::Error for n < 0 or more than 1024.
void set_num_threads(int n);
int num_threads();
int hardware_threads();

}  // namespace kv
