// What every kernel lab shares: its two options and a timing loop. Labs stay standalone
// programs (STYLE item 7); this header keeps them from each parsing and timing their own way.
#pragma once

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "kernels/cpu/cpu_variants.h"

namespace kv::lab {

struct LabArgs {
    bool quick = false;
    int threads = omp_get_max_threads();
    bool ok = true;  // false: a usage error was printed
};

// --quick and --threads N; anything else prints the usage line of `program`.
inline LabArgs parse_lab_args(int argc, char** argv, const char* program) {
    LabArgs a;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--quick")) a.quick = true;
        else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) a.threads = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: %s [--quick] [--threads N]\n", program);
            a.ok = false;
            return a;
        }
    }
    return a;
}

// Mean seconds per call of fn(i) over at least min_s seconds, after one untimed call.
inline double seconds_per_call(const std::function<void(size_t)>& fn, double min_s) {
    fn(0);
    size_t i = 1;
    auto t0 = std::chrono::steady_clock::now();
    double el = 0;
    do {
        fn(i++);
        el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (el < min_s);
    return el / double(i - 1);
}

// The product's kernels as kvlab would run them here (the CPU kernel variant chosen for this
// CPU, printed); nullptr after printing why when KVLAB_CPU_VARIANT names one it cannot use.
inline KernelBackend* lab_backend() {
    const cpu::VariantChoice& variant = cpu::chosen_variant();
    if (!variant.backend) {
        std::fprintf(stderr, "%s\n", variant.error.c_str());
        return nullptr;
    }
    std::printf("kernels: %s\n", variant.status.c_str());
    return variant.backend;
}

}  // namespace kv::lab
