// Work units shared by the calling thread and persistent helper threads, for the streaming
// kernels of a decode step (small-M matmul, SDPA decode): many short calls, each bound by
// reading memory once. The caller runs units itself from the start and returns as soon as
// every unit is done; a helper that wakes late finds no unit left and never touches the
// call. An OpenMP team instead waits at its closing barrier for every member to arrive,
// which on a loaded machine (the other core busy) costs up to a scheduler tick per call.
// Helpers poll briefly for the next call while no thread waits for a CPU, then sleep on a
// condition variable (unit_pool.cpp). Results must not depend on which thread ran a unit.
#pragma once

#include <cstdint>
#include <type_traits>

namespace kv::cpu {

// Calls fn(ctx, u) for every u in [0, units) on the calling thread and up to threads - 1
// helpers; returns when all calls have returned. fn must not throw.
void run_units(int threads, int64_t units, void (*fn)(void* ctx, int64_t unit), void* ctx);

// Lambda form: run_units(threads, units, [&](int64_t u) { ... }).
template <class F>
void run_units(int threads, int64_t units, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_units(threads, units, [](void* c, int64_t u) { (*static_cast<Fn*>(c))(u); }, const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace kv::cpu
