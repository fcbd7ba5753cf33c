// Backend registry: the CPU backend (built in, or a kernel variant library chosen for this
// CPU at start-up) and the CUDA backend, both variant libraries and CUDA via dlopen.
#include "backend_registry.h"

#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_variants.h"

#ifndef KVLAB_CUDA_PLUGIN_PATH
#define KVLAB_CUDA_PLUGIN_PATH ""
#endif

namespace kv {

namespace {
struct CudaPlugin {
    std::once_flag once;
    void* handle = nullptr;
    std::unique_ptr<KernelBackend> backend;
    std::string status;
    std::string detail;
    std::atomic<bool> probed{false};  // set once load_cuda_plugin has finished
};
CudaPlugin& plugin() {
    static CudaPlugin p;
    return p;
}

void load_cuda_plugin(CudaPlugin& p) {
    if (std::string(KVLAB_CUDA_PLUGIN_PATH).empty() && !std::getenv("KVLAB_CUDA_PLUGIN")) {
        p.status = "not built (configure with KVLAB_CUDA=ON and nvcc available)";
        return;
    }
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KVLAB_CUDA_PLUGIN")) candidates.push_back(env);
    for (const std::string& dir : cpu::plugin_dirs()) candidates.push_back(dir + "/libkvlab_cuda.so");
    if (!std::string(KVLAB_CUDA_PLUGIN_PATH).empty()) candidates.push_back(KVLAB_CUDA_PLUGIN_PATH);
    std::string errors;
    for (const auto& path : candidates) {
        if (access(path.c_str(), R_OK) != 0) continue;
        p.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!p.handle) {
            errors += str(" ", path, ": ", dlerror(), ";");
            continue;
        }
        using CreateFn = KernelBackend* (*)();
        auto create = reinterpret_cast<CreateFn>(dlsym(p.handle, "kvlab_cuda_backend_create"));
        if (!create) {
            errors += str(" ", path, ": missing kvlab_cuda_backend_create;");
            continue;
        }
        p.backend.reset(create());
        int n = p.backend->device_count();
        if (n > 0) {
            p.status = str("built, ", n, " device", n == 1 ? "" : "s");
        } else {
            // 35 insufficient driver (none installed reads the same), 34 stub library, 100 no
            // device: to a user all mean "no NVIDIA GPU usable here", not "update the driver".
            const std::string reason = p.backend->unavailable_reason();
            const bool no_gpu = reason.find("error 35 ") != std::string::npos || reason.find("error 34 ") != std::string::npos ||
                                reason.find("error 100 ") != std::string::npos || reason == "no CUDA device found";
            p.status = no_gpu ? "built, no NVIDIA driver or GPU found" : "built, no usable device";
            p.detail = reason;
        }
        return;
    }
    p.status = errors.empty() ? "built, but libkvlab_cuda.so was not found next to the executable"
                              : "built, but the plugin failed to load:" + errors;
}
}  // namespace

KernelBackend& cpu_backend() {
    const cpu::VariantChoice& c = cpu::chosen_variant();
    if (!c.backend) throw Error(c.error, c.hint);
    return *c.backend;
}

std::vector<CpuVariant> cpu_variants() { return cpu::variants_info(); }

KernelBackend* cpu_variant_backend(const std::string& name) { return cpu::variant_backend(name); }

std::string cpu_variant_status() {
    cpu_backend();
    return cpu::chosen_variant().status;
}

KernelBackend* cuda_backend() {
    CudaPlugin& p = plugin();
    std::call_once(p.once, [&] {
        load_cuda_plugin(p);
        p.probed.store(true);
    });
    return p.backend.get();
}

bool cuda_available() {
    KernelBackend* b = cuda_backend();
    return b && b->device_count() > 0;
}

std::string cuda_status() {
    cuda_backend();
    return plugin().status;
}

std::string cuda_status_if_loaded() {
    return plugin().probed.load() ? plugin().status : "not loaded (no CUDA device used by this process)";
}

std::string cuda_status_detail() {
    cuda_backend();
    return plugin().detail;
}

KernelBackend& backend_for(Device device) {
    if (device.is_cpu()) return cpu_backend();
    KernelBackend* b = cuda_backend();
    if (!b || device.index >= b->device_count() || device.index < 0)
        throw Error(str("device cuda:", device.index, " is not available (CUDA backend: ", cuda_status(), ")"),
                    "use --device cpu");
    return *b;
}

void* device_alloc(Device device, size_t bytes) {
    return backend_for(device).alloc(device.index, bytes);
}

void device_free(Device device, void* ptr) {
    if (ptr) backend_for(device).free(device.index, ptr);
}

namespace {
int g_threads = 0;
}

int hardware_threads() {
    // Read once: hardware_concurrency() opens /sys/devices/system/cpu/online on every call,
    // and every op dispatch asks for the thread count.
    static const int n = [] {
        unsigned h = std::thread::hardware_concurrency();
        return h ? int(h) : 1;
    }();
    return n;
}

void set_num_threads(int n) {
    if (n < 0 || n > 1024)
        throw Error(str("--threads: ", n, " is out of range; expected 0 (all cores) or 1..1024 (this machine has ",
                        hardware_threads(), " cores)"));
    g_threads = n;
    omp_set_num_threads(n == 0 ? hardware_threads() : n);
}

int num_threads() { return g_threads == 0 ? hardware_threads() : g_threads; }

}  // namespace kv
