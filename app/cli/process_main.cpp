#include "process_main.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define KV_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define KV_CPU_RELAX() ((void)0)
#endif

#include "cli_args.h"
#include "engine/core/error.h"

namespace kv::cli {

namespace {
// OpenMP workers wait between parallel regions. libgomp's default polls ~300k pause
// instructions (~4 ms here) before sleeping: on a machine shared with other work (2 cores)
// that steals the time slices the main thread needs (a tiny model ran 5x slower under load).
// Sleeping at once (OMP_WAIT_POLICY=PASSIVE) pays a futex wake for every region instead, and a
// prefill issues thousands of regions microseconds apart: 2-thread prefill of `small` ran 1.3-1.5x
// slower sleeping than polling, and the families with more, smaller operators lost most
// (Gemma 3n). So workers poll about as long as the unit pool's helpers (kernels/cpu/unit_pool.cpp,
// 200 us) and then sleep: under two busy loops on the 2 cores that window ran no slower than
// sleeping (docs/PERFORMANCE.md). GOMP_SPINCOUNT counts polls of one pause each, whose latency
// differs between CPUs (13.6 ns on the Xeon model 207 here, ~40 ns on Skylake-SP), so it is
// timed first. libgomp reads it when it loads, before main(), so set it and re-execute once;
// a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left alone.
constexpr double kOpenMpPollNs = 200e3;

long long openmp_poll_count() {
    constexpr int kPauses = 4096;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPauses; ++i) KV_CPU_RELAX();
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kPauses;
    // A descheduled timing reads long: the bounds keep the window between ~20 us and ~2 ms.
    return std::clamp((long long)(kOpenMpPollNs / std::max(ns, 1.0)), 1000LL, 100000LL);
}

void bounded_openmp_polling(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv("KVLAB_NO_REEXEC")) return;
    setenv("GOMP_SPINCOUNT", std::to_string(openmp_poll_count()).c_str(), 1);
    setenv("KVLAB_NO_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then carry on as we are
}

// Activations and logits are large, short-lived and re-allocated every chunk. Above glibc's
// mmap threshold each one would be fresh zeroed pages (page faults cost ~15% of a prefill), so
// keep freed blocks in the heap for reuse instead.
void keep_freed_memory_for_reuse() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}
}  // namespace

int guarded_main(int argc, char** argv, int (*run)(int, char**)) {
    // A file-size limit (ulimit -f) must fail the write that crosses it with EFBIG, which
    // storage reports like a full disk, instead of killing the process.
    std::signal(SIGXFSZ, SIG_IGN);
    bounded_openmp_polling(argv);
    keep_freed_memory_for_reuse();
    try {
        return run(argc, argv);
    } catch (const UsageError& e) {
        std::fprintf(stderr, "kvlab: %s\n", e.what());
        return 2;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "kvlab: error: out of memory (an allocation failed)\n"
                             "  hint: lower the cache length, sequence length or batch, or set --memory.budget\n");
        return 1;
    } catch (const Error& e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        if (!e.hint().empty()) std::fprintf(stderr, "  hint: %s\n", e.hint().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        return 1;
    }
}

}  // namespace kv::cli
