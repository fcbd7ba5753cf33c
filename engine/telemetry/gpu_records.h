// GPU activity records as the CUPTI plugin (libkvlab_cupti.so) hands them to the engine, and
// the C interface between the plugin and its loader (gpu_tracer.cpp). Plain C layout so both
// sides agree without sharing any C++ object across the dlopen boundary.
// Must not include CUDA or CUPTI headers: kvlab_core is built without them.
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

// Bumped whenever a struct below or a plugin function signature changes; the loader refuses
// a plugin built against another version instead of misreading its records.
#define KVLAB_GPU_ABI_VERSION 1

// Times are already converted to the engine clock (kv::now_ns()).
// Columns follow Nsight Systems' CUPTI_ACTIVITY_KIND_KERNEL export.
struct GpuKernel {
    uint64_t start, end;
    uint32_t device_id, context_id, stream_id, correlation_id;
    uint32_t demangled_name_id;  // kv::trace::intern() ids
    uint32_t short_name_id;
    int32_t grid_x, grid_y, grid_z;
    int32_t block_x, block_y, block_z;
    int32_t static_shared_memory, dynamic_shared_memory;
    uint32_t registers_per_thread;
    uint32_t local_memory_per_thread;
    uint64_t local_memory_total;
    uint64_t graph_node_id;
    uint32_t graph_id;
    uint8_t launch_type, cache_config;
    uint8_t reserved[2];
};

struct GpuMemcpy {  // CUPTI_ACTIVITY_KIND_MEMCPY
    uint64_t start, end;
    uint32_t device_id, context_id, stream_id, correlation_id;
    uint64_t bytes;
    uint8_t copy_kind, src_kind, dst_kind, flags;
    uint32_t reserved;
    uint64_t graph_node_id;
};

struct GpuMemset {  // CUPTI_ACTIVITY_KIND_MEMSET
    uint64_t start, end;
    uint32_t device_id, context_id, stream_id, correlation_id;
    uint64_t bytes;
    uint32_t value;
    uint16_t mem_kind, flags;
    uint64_t graph_node_id;
};

struct GpuMemory {   // CUPTI_ACTIVITY_KIND_MEMORY2 (nsys: CUDA_GPU_MEMORY_USAGE_EVENTS)
    uint64_t start;  // timestamp of the allocation or release
    uint32_t device_id, context_id, stream_id, correlation_id;
    uint64_t address, bytes, pc;
    uint32_t mem_kind;               // CUpti_ActivityMemoryKind
    uint32_t memory_operation_type;  // 1 allocation, 2 release (CUpti_ActivityMemoryOperationType)
    uint32_t is_async;
    uint32_t name_id;  // intern() id of the variable name (0 = none)
    uint64_t pool_address, pool_release_threshold, pool_size, pool_utilized_size;
};

struct GpuCorrelation {       // CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION
    uint64_t external_id;     // the engine span's correlation_id
    uint32_t correlation_id;  // CUPTI's id on kernel/memcpy/memset/memory records
    uint32_t external_kind;   // CUpti_ExternalCorrelationKind (CUSTOM0 for engine spans)
};

// What the loader gives the plugin. Callbacks may run on CUPTI's worker threads.
struct KvGpuHost {
    uint32_t abi_version;  // KVLAB_GPU_ABI_VERSION
    void* ctx;
    uint64_t (*now_ns)(void);                         // engine clock
    uint32_t (*intern)(void* ctx, const char* text);  // returns kv::trace::intern(text)
    // One CUPTI buffer's records, converted. Arrays are only valid during the call.
    void (*emit)(void* ctx, const GpuKernel* k, size_t nk, const GpuMemcpy* c, size_t nc, const GpuMemset* s, size_t ns,
                 const GpuMemory* m, size_t nm, const GpuCorrelation* x, size_t nx, uint64_t dropped);
};

// Functions the plugin exports (looked up with dlsym by gpu_tracer.cpp).
typedef int (*kvlab_gpu_abi_version_fn)(void);
// 0: tracing; otherwise unavailable and `reason` holds why (NUL-terminated, truncated to len).
typedef int (*kvlab_gpu_start_fn)(const KvGpuHost* host, uint32_t flush_period_ms, char* reason, size_t reason_len);
typedef void (*kvlab_gpu_push_correlation_fn)(uint64_t external_id);
typedef void (*kvlab_gpu_pop_correlation_fn)(void);
typedef void (*kvlab_gpu_flush_fn)(int forced);
typedef void (*kvlab_gpu_stop_fn)(void);

}  // extern "C"
