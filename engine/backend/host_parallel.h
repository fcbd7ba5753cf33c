// The engine's own host loops (fused row passes of the model, policy scoring) on the threads
// the CPU kernels use (KernelBackend::run_host_units: the kernels' unit pool), so a forward
// has one set of helper threads, which poll between the many short calls only while the CPUs
// are otherwise idle. Units must be independent: which thread runs one never changes a result.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "engine/backend/backend_registry.h"

namespace kv {

// The thread count of host loops: the kernels' (--threads; set_num_threads).
inline int host_threads() { return std::max(1, num_threads()); }

// fn(u) for every u in [0, units).
template <class F>
void host_parallel_units(int64_t units, F&& fn) {
    if (units <= 0) return;
    using Fn = std::remove_reference_t<F>;
    const int threads = int(std::min<int64_t>(host_threads(), units));
    if (threads <= 1) {
        for (int64_t u = 0; u < units; ++u) fn(u);
        return;
    }
    cpu_backend().run_host_units(threads, units, [](void* c, int64_t u) { (*static_cast<Fn*>(c))(u); },
                                 const_cast<void*>(static_cast<const void*>(&fn)));
}

// fn(r0, r1) over [0, rows) split evenly into one contiguous range per thread.
template <class F>
void host_parallel_rows(int64_t rows, F&& fn) {
    if (rows <= 0) return;
    const int64_t nt = std::min<int64_t>(host_threads(), rows);
    host_parallel_units(nt, [&](int64_t t) { fn(rows * t / nt, rows * (t + 1) / nt); });
}

}  // namespace kv
