// GPU activity tracing through CUPTI, loaded at run time from libkvlab_cupti.so (built only
// with CUDA; found next to the executable like libkvlab_cuda.so). Kernel, memcpy, memset and
// MEMORY2 records arrive as GPU_BATCH events in a Recorder; engine spans push external
// correlation ids so GPU records map back to layer/chunk/cell.
// Without the plugin, a driver or a GPU it reports "unavailable: <reason>" and does nothing:
// the host tracer carries on. Never throws for a missing GPU; never links CUDA into kvlab_core.
#pragma once

#include <cstdint>
#include <string>

#include "engine/telemetry/recorder.h"

namespace kv::trace {

struct GpuTracerOptions {
    // cuptiActivityFlushPeriod: completed buffers reach the recorder at least this often, so
    // the GUI sees GPU work while the run is going.
    uint32_t flush_period_ms = 100;
};

// One tracer per process at a time (CUPTI activity state is process-global); a second one
// while the first is running reports itself unavailable.
class GpuTracer {
   public:
    explicit GpuTracer(Recorder& recorder, const GpuTracerOptions& options = {});
    ~GpuTracer();  // forced flush, then stop
    GpuTracer(const GpuTracer&) = delete;
    GpuTracer& operator=(const GpuTracer&) = delete;

    bool available() const { return available_; }
    // "tracing (CUPTI ...)" or "unavailable: <reason>".
    const std::string& status() const { return status_; }
    // Delivers completed buffers now; `forced` also delivers partially filled ones.
    void flush(bool forced = false);

   private:
    bool available_ = false;
    std::string status_;
};

// Whether the plugin was built and where it was looked for (for `kvlab version`).
std::string gpu_tracer_plugin_status();

}  // namespace kv::trace
