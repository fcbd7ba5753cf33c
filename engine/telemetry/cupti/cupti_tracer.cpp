// libkvlab_cupti.so: CUPTI Activity API tracing for kvlab (loaded by engine/telemetry/
// gpu_tracer.cpp with dlopen). Enables CONCURRENT_KERNEL, MEMCPY, MEMSET, MEMORY2,
// EXTERNAL_CORRELATION and (for the latter) RUNTIME/DRIVER, hands CUPTI 4 MiB buffers, converts completed buffers through
// cupti_record_adapter.h and emits them to the host; flushes periodically for live views.
// Links CUDA::cupti and CUDA::cudart only (never the driver stub, or it would not load without
// a driver). Decides availability from cudaGetDeviceCount before any CUPTI call, and treats
// every CUPTI error as "unavailable", never as fatal.
#include <cuda_runtime_api.h>
#include <cupti.h>
#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "engine/telemetry/cupti/cupti_record_adapter.h"
#include "engine/telemetry/kernel_short_name.h"
#include "engine/telemetry/gpu_records.h"

namespace {

// CUPTI recommends 1-10 MB buffers; Kineto uses 4 MiB.
constexpr size_t kBufferBytes = size_t(4) << 20;

std::mutex g_mu;  // guards g_host and g_running across start/stop
KvGpuHost g_host{};
std::atomic<bool> g_running{false};
std::atomic<int64_t> g_offset{0};  // engine clock - CUPTI clock

void set_reason(char* reason, size_t len, const std::string& text) {
    if (!reason || !len) return;
    std::snprintf(reason, len, "%s", text.c_str());
}

std::string cupti_error(CUptiResult r) {
    const char* s = nullptr;
    if (cuptiGetResultString(r, &s) != CUPTI_SUCCESS || !s) s = "unknown CUPTI error";
    return std::to_string(int(r)) + " (" + s + ")";
}

#if KVLAB_CUPTI_RECORDS_SUPPORTED
struct Kind {
    CUpti_ActivityKind kind;
    const char* name;
};
const Kind kKinds[] = {
    {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "CONCURRENT_KERNEL"},
    {CUPTI_ACTIVITY_KIND_MEMCPY, "MEMCPY"},
    {CUPTI_ACTIVITY_KIND_MEMSET, "MEMSET"},
    {CUPTI_ACTIVITY_KIND_MEMORY2, "MEMORY2"},
    {CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, "EXTERNAL_CORRELATION"},
    // CUPTI writes an external-correlation record only ahead of an API activity record
    // (cupti_activity.h, cuptiActivityPushExternalCorrelationId): without RUNTIME and DRIVER
    // enabled no kernel maps to its engine span (seen on an H200, docs/GPU.md). Their own
    // records are dropped in buffer_completed.
    {CUPTI_ACTIVITY_KIND_RUNTIME, "RUNTIME"},
    {CUPTI_ACTIVITY_KIND_DRIVER, "DRIVER"},
};


void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    void* p = nullptr;
    if (posix_memalign(&p, 8, kBufferBytes) != 0) p = nullptr;
    *buffer = static_cast<uint8_t*>(p);
    *size = p ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
}

// Runs on a CUPTI worker thread (or the thread calling cuptiActivityFlushAll): convert, emit,
// free. Kept cheap; the host only copies the arrays into one queued event.
void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid) {
    std::vector<GpuKernel> kernels;
    std::vector<GpuMemcpy> memcpys;
    std::vector<GpuMemset> memsets;
    std::vector<GpuMemory> memory;
    std::vector<GpuCorrelation> correlations;
    KvGpuHost host;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        host = g_host;
    }
    const int64_t offset = g_offset.load(std::memory_order_relaxed);
    CUpti_Activity* record = nullptr;
    while (host.emit && buffer && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        switch (record->kind) {
            case CUPTI_ACTIVITY_KIND_KERNEL:
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const auto& k = *reinterpret_cast<const kv::cupti::KernelRecord*>(record);
                std::string demangled = k.name ? k.name : "";
                int status = 0;
                if (char* d = abi::__cxa_demangle(demangled.c_str(), nullptr, nullptr, &status)) {
                    if (status == 0) demangled = d;
                    std::free(d);
                }
                kernels.push_back(kv::cupti::convert(k, offset, host.intern(host.ctx, demangled.c_str()),
                                                     host.intern(host.ctx, kv::trace::kernel_short_name(demangled).c_str())));
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY:
                memcpys.push_back(
                    kv::cupti::convert(*reinterpret_cast<const kv::cupti::MemcpyRecord*>(record), offset));
                break;
            case CUPTI_ACTIVITY_KIND_MEMSET:
                memsets.push_back(
                    kv::cupti::convert(*reinterpret_cast<const kv::cupti::MemsetRecord*>(record), offset));
                break;
            case CUPTI_ACTIVITY_KIND_MEMORY2: {
                const auto& m = *reinterpret_cast<const kv::cupti::MemoryRecord*>(record);
                memory.push_back(kv::cupti::convert(m, offset, m.name ? host.intern(host.ctx, m.name) : 0));
                break;
            }
            case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION:
                correlations.push_back(
                    kv::cupti::convert(*reinterpret_cast<const kv::cupti::CorrelationRecord*>(record)));
                break;
            default:
                break;
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) != CUPTI_SUCCESS) dropped = 0;
    if (host.emit)
        host.emit(host.ctx, kernels.data(), kernels.size(), memcpys.data(), memcpys.size(), memsets.data(),
                  memsets.size(), memory.data(), memory.size(), correlations.data(), correlations.size(),
                  uint64_t(dropped));
    std::free(buffer);
}

void disable_all() {
    for (const Kind& k : kKinds) cuptiActivityDisable(k.kind);
}
#endif

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int kvlab_gpu_abi_version(void) { return KVLAB_GPU_ABI_VERSION; }

__attribute__((visibility("default"))) int kvlab_gpu_start(const KvGpuHost* host, uint32_t flush_period_ms,
                                                           char* reason, size_t reason_len) {
    if (!host || host->abi_version != KVLAB_GPU_ABI_VERSION || !host->emit || !host->intern || !host->now_ns) {
        set_reason(reason, reason_len, "the loader and libkvlab_cupti.so disagree on the ABI");
        return 1;
    }
#if !KVLAB_CUPTI_RECORDS_SUPPORTED
    (void)flush_period_ms;
    set_reason(reason, reason_len,
               "this build's CUPTI (CUPTI_API_VERSION " + std::to_string(int(CUPTI_API_VERSION)) +
                   ") has record structs kvlab does not know; add them to cupti_record_adapter.h");
    return 1;
#else
    // Without a driver cudaGetDeviceCount returns 35 and leaves n untouched, and CUPTI then
    // answers 999 to everything: decide here, before any CUPTI call. The environment switch
    // exists so tests can exercise the CUPTI error path on machines without a GPU.
    const bool skip_device_check = std::getenv("KVLAB_CUPTI_IGNORE_DEVICE_COUNT") != nullptr;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (!skip_device_check && (e != cudaSuccess || n <= 0)) {
        std::string why = e != cudaSuccess
                              ? std::string("no usable CUDA driver or device (cudaGetDeviceCount returned ") +
                                    std::to_string(int(e)) + ": " + cudaGetErrorString(e) + ")"
                              : std::string("no CUDA device");
        (void)cudaGetLastError();
        set_reason(reason, reason_len, why);
        return 1;
    }
    {
        // Not held across CUPTI calls: buffer_completed takes it and CUPTI may call back on
        // any thread.
        std::lock_guard<std::mutex> lk(g_mu);
        if (g_running.load()) {
            set_reason(reason, reason_len, "CUPTI tracing is already running in this process");
            return 1;
        }
        g_host = *host;
    }
    auto fail = [&](const std::string& why) {
        disable_all();
        std::lock_guard<std::mutex> lk(g_mu);
        g_host = KvGpuHost{};
        set_reason(reason, reason_len, why);
        return 1;
    };
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) return fail("cuptiActivityRegisterCallbacks returned " + cupti_error(r));
    for (const Kind& k : kKinds) {
        r = cuptiActivityEnable(k.kind);
        if (r != CUPTI_SUCCESS) return fail(std::string("cuptiActivityEnable(") + k.name + ") returned " + cupti_error(r));
    }
    uint64_t cupti_now = 0;
    if (cuptiGetTimestamp(&cupti_now) == CUPTI_SUCCESS && cupti_now)
        g_offset.store(int64_t(host->now_ns()) - int64_t(cupti_now));
    // Periodic flush is what makes GPU records show up live; failing it only delays them.
    (void)cuptiActivityFlushPeriod(flush_period_ms);
    g_running.store(true);
    return 0;
#endif
}

__attribute__((visibility("default"))) void kvlab_gpu_push_correlation(uint64_t external_id) {
    if (g_running.load(std::memory_order_relaxed))
        (void)cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, external_id);
}

__attribute__((visibility("default"))) void kvlab_gpu_pop_correlation(void) {
    uint64_t last = 0;
    if (g_running.load(std::memory_order_relaxed))
        (void)cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &last);
}

__attribute__((visibility("default"))) void kvlab_gpu_flush(int forced) {
    if (g_running.load()) (void)cuptiActivityFlushAll(forced ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);
}

__attribute__((visibility("default"))) void kvlab_gpu_stop(void) {
#if KVLAB_CUPTI_RECORDS_SUPPORTED
    if (!g_running.load()) return;
    // Flush before disabling so the last partially filled buffers reach the host; no
    // cuptiFinalize, so a later run in the same process can start tracing again.
    (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    (void)cuptiActivityFlushPeriod(0);
    disable_all();
    std::lock_guard<std::mutex> lk(g_mu);
    g_host = KvGpuHost{};
    g_running.store(false);
#endif
}

}  // extern "C"
