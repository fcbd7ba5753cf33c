// Loader for the CUPTI plugin (see gpu_tracer.h): dlopen once, check the ABI version, then
// forward start/stop/flush and the correlation push/pop that spans issue. The plugin calls back
// through KvGpuHost, whose emit() turns a converted CUPTI buffer into one GPU_BATCH event.
#include "gpu_tracer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"
#include "engine/telemetry/string_table.h"
#include "engine/telemetry/trace.h"
#include "kernels/cpu/cpu_variants.h"

#ifndef KVLAB_CUPTI_PLUGIN_PATH
#define KVLAB_CUPTI_PLUGIN_PATH ""
#endif

namespace kv::trace {

namespace {
struct Plugin {
    std::once_flag once;
    void* handle = nullptr;
    std::string status;  // why it is not usable (empty when loaded)
    kvlab_gpu_start_fn start = nullptr;
    kvlab_gpu_push_correlation_fn push = nullptr;
    kvlab_gpu_pop_correlation_fn pop = nullptr;
    kvlab_gpu_flush_fn flush = nullptr;
    kvlab_gpu_stop_fn stop = nullptr;
};
Plugin& plugin() {
    static Plugin p;
    return p;
}

// The recorder GPU batches go to. emit() may run on a CUPTI worker thread while the tracer is
// being stopped, hence the mutex; it is never held while calling into the plugin.
std::mutex g_emit_mu;
Recorder* g_recorder = nullptr;
std::mutex g_owner_mu;  // serializes start/stop; one tracer per process
bool g_running = false;

template <class Fn>
Fn sym(void* h, const char* name) {
    return reinterpret_cast<Fn>(dlsym(h, name));
}

void load(Plugin& p) {
    const char* env = std::getenv("KVLAB_CUPTI_PLUGIN");
    if (std::string(KVLAB_CUPTI_PLUGIN_PATH).empty() && !env) {
        p.status = "not built (configure with CUDA available to build libkvlab_cupti.so)";
        return;
    }
    std::vector<std::string> candidates;
    if (env) candidates.push_back(env);
    for (const std::string& dir : cpu::plugin_dirs()) candidates.push_back(dir + "/libkvlab_cupti.so");
    if (!std::string(KVLAB_CUPTI_PLUGIN_PATH).empty()) candidates.push_back(KVLAB_CUPTI_PLUGIN_PATH);
    std::string errors;
    for (const auto& path : candidates) {
        if (access(path.c_str(), R_OK) != 0) continue;
        void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            errors += str(" ", path, ": ", dlerror(), ";");
            continue;
        }
        auto version = sym<kvlab_gpu_abi_version_fn>(h, "kvlab_gpu_abi_version");
        if (!version || version() != KVLAB_GPU_ABI_VERSION) {
            errors +=
                str(" ", path, ": ABI version ", version ? version() : -1, ", expected ", KVLAB_GPU_ABI_VERSION, ";");
            dlclose(h);
            continue;
        }
        p.start = sym<kvlab_gpu_start_fn>(h, "kvlab_gpu_start");
        p.push = sym<kvlab_gpu_push_correlation_fn>(h, "kvlab_gpu_push_correlation");
        p.pop = sym<kvlab_gpu_pop_correlation_fn>(h, "kvlab_gpu_pop_correlation");
        p.flush = sym<kvlab_gpu_flush_fn>(h, "kvlab_gpu_flush");
        p.stop = sym<kvlab_gpu_stop_fn>(h, "kvlab_gpu_stop");
        if (!p.start || !p.push || !p.pop || !p.flush || !p.stop) {
            errors += str(" ", path, ": missing kvlab_gpu_* entry points;");
            p.start = nullptr;
            dlclose(h);
            continue;
        }
        p.handle = h;
        return;
    }
    p.status = errors.empty() ? "built, but libkvlab_cupti.so was not found next to the executable"
                              : "built, but the plugin failed to load:" + errors;
}

Plugin* loaded_plugin() {
    Plugin& p = plugin();
    std::call_once(p.once, [&] { load(p); });
    return p.handle ? &p : nullptr;
}

uint32_t host_intern(void*, const char* text) { return text ? intern(text) : 0; }

void host_emit(void*, const GpuKernel* k, size_t nk, const GpuMemcpy* c, size_t nc, const GpuMemset* s, size_t ns,
               const GpuMemory* m, size_t nm, const GpuCorrelation* x, size_t nx, uint64_t dropped) {
    std::lock_guard<std::mutex> lk(g_emit_mu);
    if (!g_recorder) return;
    if (dropped) g_recorder->add_gpu_dropped(dropped);
    if (nk + nc + ns + nm + nx == 0) return;
    auto* payload = new GpuBatchPayload();
    payload->kernels.assign(k, k + nk);
    payload->memcpys.assign(c, c + nc);
    payload->memsets.assign(s, s + ns);
    payload->memory.assign(m, m + nm);
    payload->correlations.assign(x, x + nx);
    payload->dropped = dropped;
    Event ev;
    ev.gpu = GpuBatchRecord{};
    ev.gpu.type = EventType::GPU_BATCH;
    ev.gpu.t_ns = now_ns();
    ev.gpu.payload = payload;
    g_recorder->push(ev);
}

uint64_t host_now() { return now_ns(); }
}  // namespace

namespace detail {
void gpu_push_correlation(uint64_t id) {
    Plugin& p = plugin();
    if (p.push) p.push(id);
}
void gpu_pop_correlation() {
    Plugin& p = plugin();
    if (p.pop) p.pop();
}
}  // namespace detail

GpuTracer::GpuTracer(Recorder& recorder, const GpuTracerOptions& options) {
    Plugin* p = loaded_plugin();
    if (!p) {
        status_ = "unavailable: CUPTI plugin " + plugin().status;
        return;
    }
    std::lock_guard<std::mutex> lk(g_owner_mu);
    if (g_running) {
        status_ = "unavailable: another run is already tracing the GPU in this process";
        return;
    }
    {
        std::lock_guard<std::mutex> ek(g_emit_mu);
        g_recorder = &recorder;
    }
    static const KvGpuHost host = {KVLAB_GPU_ABI_VERSION, nullptr, &host_now, &host_intern, &host_emit};
    char reason[512] = {0};
    if (p->start(&host, options.flush_period_ms, reason, sizeof reason) != 0) {
        std::lock_guard<std::mutex> ek(g_emit_mu);
        g_recorder = nullptr;
        status_ = std::string("unavailable: ") + (reason[0] ? reason : "CUPTI refused to start");
        return;
    }
    g_running = true;
    available_ = true;
    detail::g_gpu_correlation.store(true, std::memory_order_release);
    status_ = "tracing (CUPTI activity: kernel, memcpy, memset, memory)";
}

GpuTracer::~GpuTracer() {
    if (!available_) return;
    std::lock_guard<std::mutex> lk(g_owner_mu);
    detail::g_gpu_correlation.store(false, std::memory_order_release);
    Plugin& p = plugin();
    p.stop();  // forced flush: the last buffers are emitted before this returns
    std::lock_guard<std::mutex> ek(g_emit_mu);
    g_recorder = nullptr;
    g_running = false;
}

void GpuTracer::flush(bool forced) {
    if (available_) plugin().flush(forced ? 1 : 0);
}

std::string gpu_tracer_plugin_status() {
    Plugin* p = loaded_plugin();
    return p ? std::string("built, loaded") : plugin().status;
}

}  // namespace kv::trace
