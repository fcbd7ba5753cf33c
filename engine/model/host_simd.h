// Host loops of the model code compiled per ISA level. engine/ is built for the x86-64-v2
// baseline, where f32 loops run 4 lanes wide; a body written once (always_inline) gets wrappers
// for x86-64-v4 and v3 through KV_HOST_SIMD_VARIANTS, and the level follows the CPU kernel
// variant in use, so KVLAB_CPU_VARIANT=avx2 / base narrows these loops as it does the kernels.
#pragma once

#include <string>

#include "engine/backend/backend_registry.h"

// ASan builds refuse always_inline across target attributes: they keep the baseline only.
#if defined(__SANITIZE_ADDRESS__) || !defined(__x86_64__)
#define KV_HOST_SIMD_INLINE inline
#define KV_HOST_SIMD_MULTI 0
#else
#define KV_HOST_SIMD_INLINE __attribute__((always_inline)) inline
#define KV_HOST_SIMD_MULTI 1
#endif

namespace kv {

// 4 = AVX-512, 3 = AVX2 + FMA, 2 = the baseline: the level of the CPU kernel variant chosen.
inline int host_simd_level() {
    static const int lv = [] {
        const std::string v = cpu_backend().kernel_variant();
        if (v.rfind("avx512", 0) == 0) return 4;
        if (v == "avx2") return 3;
        return 2;
    }();
    return lv;
}

}  // namespace kv

// F##_any PARAMS: F##_body ARGS compiled for the level host_simd_level() gives.
#if KV_HOST_SIMD_MULTI
#define KV_HOST_SIMD_VARIANTS(F, PARAMS, ARGS)                     \
    __attribute__((target("arch=x86-64-v4"))) void F##_v4 PARAMS { \
        F##_body ARGS;                                             \
    }                                                              \
    __attribute__((target("arch=x86-64-v3"))) void F##_v3 PARAMS { \
        F##_body ARGS;                                             \
    }                                                              \
    void F##_v2 PARAMS {                                           \
        F##_body ARGS;                                             \
    }                                                              \
    void F##_any PARAMS {                                          \
        const int lv = ::kv::host_simd_level();                    \
        if (lv >= 4) return F##_v4 ARGS;                           \
        if (lv >= 3) return F##_v3 ARGS;                           \
        F##_v2 ARGS;                                               \
    }
#else
#define KV_HOST_SIMD_VARIANTS(F, PARAMS, ARGS) \
    void F##_any PARAMS {                      \
        F##_body ARGS;                         \
    }
#endif
