// Which compute backends exist in this process, and the device memory entry points the
// tracked allocator uses. The CPU backend is always present; the CUDA backend is a plugin
// library (libkvlab_cuda.so) loaded on first use, so a CPU-only machine never loads CUDA.
#pragma once

#include <string>

#include "kernels/common/backend_iface.h"

namespace kv {

KernelBackend& cpu_backend();
// The CUDA backend if the plugin was built and loads; nullptr otherwise (see cuda_status()).
KernelBackend* cuda_backend();
// True when the CUDA plugin loaded and reports at least one device.
bool cuda_available();
// One line: "built, 1 device", "not built (KVLAB_CUDA=OFF)", "built, no usable device: ...".
std::string cuda_status();

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
