// CPU kernel variants: the hot CPU kernels compiled once per ISA level (kernels/CMakeLists.txt).
// The built-in "base" variant (the build's own flags, x86-64-v2) is always there; the others
// are libraries (libkvlab_cpu_<name>.so) next to the executable or in ../lib/kvlab. The best
// variant the CPU executes is chosen once; KVLAB_CPU_VARIANT=<name> forces one.
// The engine reaches these through engine/backend/backend_registry.h.
#pragma once

#include <string>
#include <vector>

#include "kernels/common/backend_iface.h"

namespace kv::cpu {

struct VariantInfo {
    std::string name;           // "avx512bf16", "avx512", "avx2", "base" ("native" in KVLAB_NATIVE builds)
    std::string isa;            // what it needs: "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) + AVX512-BF16", ...
    bool cpu_supports = false;  // this CPU (and OS) can execute it
    std::string missing;        // CPU features it lacks, when !cpu_supports
    bool built = false;         // the library exists and loads (always true for base)
    std::string status;         // why not built/loaded, when !built
};

// The start-up choice: a backend and why, or (a bad KVLAB_CPU_VARIANT) an error and a hint.
struct VariantChoice {
    KernelBackend* backend = nullptr;
    std::string status;  // "avx2 (best this CPU runs: ...)" / "base (forced by KVLAB_CPU_VARIANT; ...)"
    std::string error, hint;
};

// Chosen once per process (thread-safe).
const VariantChoice& chosen_variant();
// Every variant this build knows, best first (loads those the CPU can run).
std::vector<VariantInfo> variants_info();
// One variant's backend; nullptr when the CPU cannot run it or it is not built. Never loads
// a library the CPU cannot execute (its initializers could use the missing instructions).
KernelBackend* variant_backend(const std::string& name);
// Where plugin libraries are looked for: the executable's folder, then ../lib/kvlab.
std::vector<std::string> plugin_dirs();
// The running executable's folder ("" if /proc/self/exe cannot be read); installed files
// (share/kvlab, lib/kvlab) are found relative to it.
std::string executable_dir();

}  // namespace kv::cpu
