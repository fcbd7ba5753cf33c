#include "process_main.h"

#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "cli_args.h"
#include "engine/core/error.h"

namespace kv::cli {

namespace {
// OpenMP worker threads spin between parallel regions by default. On a machine shared with
// other work (2 cores here) that spinning steals the time slices the main thread needs: a tiny
// model ran 5x slower under load; even a 14 us window made four 2-thread runs at once 1.1x
// slower, 200 us 2.1x. So they sleep at once (a futex wake per region: only oneDNN's matrix
// products use OpenMP; our kernels run on the unit pool, which polls only while the CPUs are
// otherwise idle). libgomp reads OMP_WAIT_POLICY when it loads, before main(), so when the
// user has not chosen a policy we set PASSIVE and re-execute once.
void prefer_passive_openmp(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("KVLAB_NO_REEXEC")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
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
    prefer_passive_openmp(argv);
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
