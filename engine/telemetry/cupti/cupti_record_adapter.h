// The one place that knows which versioned CUPTI record structs this toolkit delivers
// (CUPTI_API_VERSION), converting them into the plain GpuKernel/GpuMemcpy/... of
// gpu_records.h. A toolkit whose structs are not listed here builds a plugin that reports itself
// unavailable instead of misreading records. Plugin-internal: never included by kvlab_core.
#pragma once

#include <cupti.h>

#include <cstdint>

#include "engine/telemetry/gpu_records.h"

// CUDA 13.0 (CUPTI_API_VERSION 130001): Kernel10, Memcpy6, Memset4, Memory4. Later 13.x
// toolkits keep these in cupti_activity_deprecated.h while delivering newer versions only to
// clients built against them, so records match the header we compiled with.
#if defined(CUPTI_API_VERSION) && CUPTI_API_VERSION >= 130000
#define KVLAB_CUPTI_RECORDS_SUPPORTED 1
namespace kv::cupti {
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
using MemsetRecord = CUpti_ActivityMemset4;
using MemoryRecord = CUpti_ActivityMemory4;
using CorrelationRecord = CUpti_ActivityExternalCorrelation;

// CUPTI timestamps + offset = engine clock (kv::now_ns()).
inline uint64_t to_engine(uint64_t t, int64_t offset) { return t ? uint64_t(int64_t(t) + offset) : 0; }

inline GpuKernel convert(const KernelRecord& r, int64_t offset, uint32_t demangled, uint32_t short_name) {
    GpuKernel k{};
    k.start = to_engine(r.start, offset);
    k.end = to_engine(r.end, offset);
    k.device_id = r.deviceId;
    k.context_id = r.contextId;
    k.stream_id = r.streamId;
    k.correlation_id = r.correlationId;
    k.demangled_name_id = demangled;
    k.short_name_id = short_name;
    k.grid_x = r.gridX;
    k.grid_y = r.gridY;
    k.grid_z = r.gridZ;
    k.block_x = r.blockX;
    k.block_y = r.blockY;
    k.block_z = r.blockZ;
    k.static_shared_memory = r.staticSharedMemory;
    k.dynamic_shared_memory = r.dynamicSharedMemory;
    k.registers_per_thread = r.registersPerThread;
    k.local_memory_per_thread = r.localMemoryPerThread;
    k.local_memory_total = r.localMemoryTotal_v2;
    k.graph_node_id = r.graphNodeId;
    k.graph_id = r.graphId;
    k.launch_type = r.launchType;
    k.cache_config = r.cacheConfig.both;
    return k;
}

inline GpuMemcpy convert(const MemcpyRecord& r, int64_t offset) {
    GpuMemcpy c{};
    c.start = to_engine(r.start, offset);
    c.end = to_engine(r.end, offset);
    c.device_id = r.deviceId;
    c.context_id = r.contextId;
    c.stream_id = r.streamId;
    c.correlation_id = r.correlationId;
    c.bytes = r.bytes;
    c.copy_kind = r.copyKind;
    c.src_kind = r.srcKind;
    c.dst_kind = r.dstKind;
    c.flags = r.flags;
    c.graph_node_id = r.graphNodeId;
    return c;
}

inline GpuMemset convert(const MemsetRecord& r, int64_t offset) {
    GpuMemset s{};
    s.start = to_engine(r.start, offset);
    s.end = to_engine(r.end, offset);
    s.device_id = r.deviceId;
    s.context_id = r.contextId;
    s.stream_id = r.streamId;
    s.correlation_id = r.correlationId;
    s.bytes = r.bytes;
    s.value = r.value;
    s.mem_kind = r.memoryKind;
    s.flags = r.flags;
    s.graph_node_id = r.graphNodeId;
    return s;
}

inline GpuMemory convert(const MemoryRecord& r, int64_t offset, uint32_t name_id) {
    GpuMemory m{};
    m.start = to_engine(r.timestamp, offset);
    m.device_id = r.deviceId;
    m.context_id = r.contextId;
    m.stream_id = r.streamId;
    m.correlation_id = r.correlationId;
    m.address = r.address;
    m.bytes = r.bytes;
    m.pc = r.PC;
    m.mem_kind = uint32_t(r.memoryKind);
    m.memory_operation_type = uint32_t(r.memoryOperationType);
    m.is_async = r.isAsync;
    m.name_id = name_id;
    m.pool_address = r.memoryPoolConfig.address;
    m.pool_release_threshold = r.memoryPoolConfig.releaseThreshold;
    m.pool_size = r.memoryPoolConfig.pool.size;
    m.pool_utilized_size = r.memoryPoolConfig.utilizedSize;
    return m;
}

inline GpuCorrelation convert(const CorrelationRecord& r) {
    GpuCorrelation x{};
    x.external_id = r.externalId;
    x.correlation_id = r.correlationId;
    x.external_kind = uint32_t(r.externalKind);
    return x;
}
}  // namespace kv::cupti
#else
#define KVLAB_CUPTI_RECORDS_SUPPORTED 0
#endif
