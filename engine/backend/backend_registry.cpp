// Backend registry: the CPU backend (built in, or a kernel variant library chosen for this
// CPU at start-up) and the CUDA backend, both variant libraries and CUDA via dlopen.
#include "backend_registry.h"

#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"

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
};
CudaPlugin& plugin() {
    static CudaPlugin p;
    return p;
}

std::string exe_dir() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return {};
    buf[n] = 0;
    std::string s(buf);
    auto pos = s.rfind('/');
    return pos == std::string::npos ? std::string() : s.substr(0, pos);
}

// Where plugin libraries are looked for: next to the executable (the build tree), then the
// installed layout (bin/kvlab -> lib/kvlab/*.so, as the Debian package lays it out).
std::vector<std::string> plugin_dirs() {
    std::vector<std::string> dirs;
    std::string dir = exe_dir();
    if (!dir.empty()) {
        dirs.push_back(dir);
        dirs.push_back(dir + "/../lib/kvlab");
    }
    return dirs;
}

void load_cuda_plugin(CudaPlugin& p) {
    if (std::string(KVLAB_CUDA_PLUGIN_PATH).empty() && !std::getenv("KVLAB_CUDA_PLUGIN")) {
        p.status = "not built (configure with KVLAB_CUDA=ON and nvcc available)";
        return;
    }
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KVLAB_CUDA_PLUGIN")) candidates.push_back(env);
    for (const std::string& dir : plugin_dirs()) candidates.push_back(dir + "/libkvlab_cuda.so");
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
// ---- CPU kernel variants ----------------------------------------------------------------
struct VariantDef {
    const char* name;
    const char* level;  // __builtin_cpu_supports argument; nullptr: the built-in backend
    const char* isa;
    std::vector<const char*> features;  // named in the message when one is missing
};
const std::vector<VariantDef>& variant_defs() {
    static const std::vector<VariantDef> defs = {
        {"avx512bf16", "x86-64-v4", "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) + AVX512-BF16",
         {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512bf16"}},
        {"avx512", "x86-64-v4", "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}},
        {"avx2", "x86-64-v3", "x86-64-v3 (AVX2, FMA, F16C, BMI2)", {"avx", "avx2", "fma", "f16c", "bmi", "bmi2"}},
        {"base", nullptr, "x86-64-v2 (SSE4.2, POPCNT)", {}},
    };
    return defs;
}

bool cpu_has(const char* feature) {
    // __builtin_cpu_supports wants a literal; map the few names used above.
    const std::string f = feature;
    if (f == "x86-64-v4") return __builtin_cpu_supports("x86-64-v4");
    if (f == "x86-64-v3") return __builtin_cpu_supports("x86-64-v3");
    if (f == "avx512f") return __builtin_cpu_supports("avx512f");
    if (f == "avx512bw") return __builtin_cpu_supports("avx512bw");
    if (f == "avx512cd") return __builtin_cpu_supports("avx512cd");
    if (f == "avx512dq") return __builtin_cpu_supports("avx512dq");
    if (f == "avx512vl") return __builtin_cpu_supports("avx512vl");
    if (f == "avx512bf16") return __builtin_cpu_supports("avx512bf16");
    if (f == "avx") return __builtin_cpu_supports("avx");
    if (f == "avx2") return __builtin_cpu_supports("avx2");
    if (f == "fma") return __builtin_cpu_supports("fma");
    if (f == "f16c") return __builtin_cpu_supports("f16c");
    if (f == "bmi") return __builtin_cpu_supports("bmi");
    if (f == "bmi2") return __builtin_cpu_supports("bmi2");
    return false;
}

struct VariantSlot {
    CpuVariant info;
    std::once_flag once;
    void* handle = nullptr;
    KernelBackend* backend = nullptr;  // owned by the library (a function-local static there)
};

struct Variants {
    std::vector<std::unique_ptr<VariantSlot>> slots;  // variant_defs() order
    std::once_flag chosen_once;
    KernelBackend* chosen = nullptr;
    std::string status;
};

Variants& variants() {
    static Variants* v = [] {
        __builtin_cpu_init();
        auto* vs = new Variants;  // never destroyed: backends outlive static destructors
        for (const VariantDef& d : variant_defs()) {
            auto slot = std::make_unique<VariantSlot>();
            slot->info.name = d.name;
            slot->info.isa = d.isa;
            if (!d.level) {
#if defined(__x86_64__)
                slot->info.cpu_supports = __builtin_cpu_supports("x86-64-v2");
#else
                slot->info.cpu_supports = true;
#endif
                slot->info.built = true;
            } else {
                bool ok = cpu_has(d.level);
                for (const char* f : d.features) {
                    if (!cpu_has(f)) slot->info.missing += std::string(slot->info.missing.empty() ? "" : ", ") + f;
                    ok = ok && cpu_has(f);
                }
                if (!ok && slot->info.missing.empty()) slot->info.missing = d.level;
                slot->info.cpu_supports = ok;
            }
            vs->slots.push_back(std::move(slot));
        }
        return vs;
    }();
    return *v;
}

// Loads a variant library (once) and records why when it cannot. Never called for a variant
// the CPU cannot run: its static initializers could already use the missing instructions.
void load_variant(VariantSlot& s) {
    if (s.info.name == "base") {
        s.backend = &cpu_kernel_backend();
        return;
    }
    const std::string file = "libkvlab_cpu_" + s.info.name + ".so";
    std::string errors;
    for (const std::string& dir : plugin_dirs()) {
        const std::string path = dir + "/" + file;
        if (access(path.c_str(), R_OK) != 0) continue;
        s.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!s.handle) {
            errors += str(" ", path, ": ", dlerror(), ";");
            continue;
        }
        using CreateFn = KernelBackend* (*)();
        auto create = reinterpret_cast<CreateFn>(dlsym(s.handle, "kvlab_cpu_backend_create"));
        if (!create) {
            errors += str(" ", path, ": missing kvlab_cpu_backend_create;");
            continue;
        }
        s.backend = create();
        s.info.built = s.backend != nullptr;
        return;
    }
    s.info.status = errors.empty() ? file + " not found next to the executable or in ../lib/kvlab" : "failed to load:" + errors;
}

VariantSlot* find_slot(const std::string& name) {
    for (auto& s : variants().slots)
        if (s->info.name == name) return s.get();
    return nullptr;
}

KernelBackend* slot_backend(VariantSlot& s) {
    if (!s.info.cpu_supports) return nullptr;
    std::call_once(s.once, [&] { load_variant(s); });
    return s.backend;
}

std::string variant_names() {
    std::string names;
    for (const VariantDef& d : variant_defs()) names += std::string(names.empty() ? "" : ", ") + d.name;
    return names;
}

void choose_variant(Variants& v) {
#if defined(KVLAB_NATIVE_BUILD)
    // -march=native: the built-in backend is specific to the building machine, and no
    // variant libraries exist.
    if (const char* env = std::getenv("KVLAB_CPU_VARIANT"); env && *env && std::string(env) != "native")
        throw Error(str("KVLAB_CPU_VARIANT=", env, ": this kvlab was built with KVLAB_NATIVE=ON, which has no kernel variants"),
                    "unset KVLAB_CPU_VARIANT, or build without -DKVLAB_NATIVE=ON");
    v.chosen = &cpu_kernel_backend();
    v.status = "native (built with -march=native for the building machine; no run-time variants)";
    return;
#endif
    if (const char* env = std::getenv("KVLAB_CPU_VARIANT"); env && *env) {
        const std::string want = env;
        VariantSlot* s = find_slot(want);
        if (!s) throw Error(str("KVLAB_CPU_VARIANT=", want, ": unknown kernel variant; expected one of ", variant_names()));
        if (!s->info.cpu_supports) {
            std::string runnable;
            for (auto& o : v.slots)
                if (o->info.cpu_supports) runnable += std::string(runnable.empty() ? "" : ", ") + o->info.name;
            throw Error(str("KVLAB_CPU_VARIANT=", want, ": this CPU cannot run it (it lacks ", s->info.missing, "; the variant needs ",
                            s->info.isa, ")"),
                        "variants this CPU runs: " + runnable);
        }
        KernelBackend* b = slot_backend(*s);
        if (!b) throw Error(str("KVLAB_CPU_VARIANT=", want, ": the variant library is not available: ", s->info.status),
                            "rebuild with it in KVLAB_CPU_VARIANTS, or pick another variant");
        v.chosen = b;
        v.status = want + " (forced by KVLAB_CPU_VARIANT; needs " + s->info.isa + ")";
        return;
    }
    std::string skipped;
    for (auto& s : v.slots) {
        if (!s->info.cpu_supports) {
            skipped += str("; ", s->info.name, ": CPU lacks ", s->info.missing);
            continue;
        }
        if (KernelBackend* b = slot_backend(*s)) {
            v.chosen = b;
            v.status = str(s->info.name, " (best this CPU runs: ", s->info.isa, skipped, ")");
            return;
        }
        skipped += str("; ", s->info.name, ": ", s->info.status);
    }
    v.chosen = &cpu_kernel_backend();  // unreachable: base is always there
    v.status = "base";
}
}  // namespace

KernelBackend& cpu_backend() {
    Variants& v = variants();
    std::call_once(v.chosen_once, [&] { choose_variant(v); });
    return *v.chosen;
}

std::vector<CpuVariant> cpu_variants() {
    std::vector<CpuVariant> out;
#if defined(KVLAB_NATIVE_BUILD)
    out.push_back({"native", "-march=native (the building machine)", true, {}, true, {}});
    return out;
#endif
    for (auto& s : variants().slots) {
        slot_backend(*s);  // loads it when the CPU can run it, filling built/status
        out.push_back(s->info);
    }
    return out;
}

KernelBackend* cpu_variant_backend(const std::string& name) {
#if defined(KVLAB_NATIVE_BUILD)
    return name == "native" ? &cpu_kernel_backend() : nullptr;
#endif
    VariantSlot* s = find_slot(name);
    return s ? slot_backend(*s) : nullptr;
}

std::string cpu_variant_status() {
    cpu_backend();
    return variants().status;
}

KernelBackend* cuda_backend() {
    CudaPlugin& p = plugin();
    std::call_once(p.once, [&] { load_cuda_plugin(p); });
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
