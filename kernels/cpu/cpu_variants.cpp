// CPU kernel variants: which ISA levels this CPU executes, loading the variant libraries
// (libkvlab_cpu_<name>.so, see kernels/CMakeLists.txt) and choosing one at start-up. Lives
// with the kernels so the labs measure the variant the product would run.
#include "cpu_variants.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>

#include "cpu_backend.h"

namespace kv::cpu {

std::string executable_dir() {
    // A host program that is not kvlab (python3 importing the kvlab module) names the folder
    // of kvlab's binaries, so the kernel variants and plugins are found beside them.
    if (const char* d = std::getenv("KVLAB_BIN_DIR"); d && *d) return d;
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return {};
    buf[n] = 0;
    std::string s(buf);
    auto pos = s.rfind('/');
    return pos == std::string::npos ? std::string() : s.substr(0, pos);
}

std::vector<std::string> plugin_dirs() {
    std::vector<std::string> dirs;
    std::string dir = executable_dir();
    if (!dir.empty()) {
        dirs.push_back(dir);
        dirs.push_back(dir + "/../lib/kvlab");
    }
    return dirs;
}

namespace {
struct Feature {
    const char* name;
    int present;  // __builtin_cpu_supports: nonzero when the CPU has it
};
struct VariantDef {
    const char* name;
    bool builtin;     // the backend compiled into this library (no variant library)
    int level_ok;     // __builtin_cpu_supports of the psABI level (it also checks OS support)
    const char* isa;
    std::vector<Feature> features;  // named in the message when one is missing
};
// __builtin_cpu_supports takes only literals, hence the table is built here, after init.
std::vector<VariantDef> variant_defs() {
    __builtin_cpu_init();
    const Feature avx512[] = {{"avx512f", __builtin_cpu_supports("avx512f")}, {"avx512bw", __builtin_cpu_supports("avx512bw")},
                              {"avx512cd", __builtin_cpu_supports("avx512cd")}, {"avx512dq", __builtin_cpu_supports("avx512dq")},
                              {"avx512vl", __builtin_cpu_supports("avx512vl")}};
    std::vector<Feature> bf16(std::begin(avx512), std::end(avx512));
    bf16.push_back({"avx512bf16", __builtin_cpu_supports("avx512bf16")});
    return {
        {"avx512bf16", false, __builtin_cpu_supports("x86-64-v4"), "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) + AVX512-BF16", bf16},
        {"avx512", false, __builtin_cpu_supports("x86-64-v4"), "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL)",
         std::vector<Feature>(std::begin(avx512), std::end(avx512))},
        {"avx2", false, __builtin_cpu_supports("x86-64-v3"), "x86-64-v3 (AVX2, FMA, F16C, BMI2)",
         {{"avx", __builtin_cpu_supports("avx")},
          {"avx2", __builtin_cpu_supports("avx2")},
          {"fma", __builtin_cpu_supports("fma")},
          {"f16c", __builtin_cpu_supports("f16c")},
          {"bmi", __builtin_cpu_supports("bmi")},
          {"bmi2", __builtin_cpu_supports("bmi2")}}},
        {"base", true, __builtin_cpu_supports("x86-64-v2"), "x86-64-v2 (SSE4.2, POPCNT)", {}},
    };
}

struct VariantSlot {
    VariantInfo info;
    std::once_flag once;
    void* handle = nullptr;
    KernelBackend* backend = nullptr;  // owned by the library (a function-local static there)
};

struct Variants {
    std::vector<std::unique_ptr<VariantSlot>> slots;  // variant_defs() order
    std::once_flag chosen_once;
    VariantChoice choice;
};

Variants& variants() {
    static Variants* v = [] {
        auto* vs = new Variants;  // never destroyed: backends outlive static destructors
        for (const VariantDef& d : variant_defs()) {
            auto slot = std::make_unique<VariantSlot>();
            slot->info.name = d.name;
            slot->info.isa = d.isa;
            slot->info.built = d.builtin;
            bool ok = d.level_ok != 0;
            for (const Feature& f : d.features) {
                if (!f.present) slot->info.missing += std::string(slot->info.missing.empty() ? "" : ", ") + f.name;
                ok = ok && f.present != 0;
            }
            if (!ok && slot->info.missing.empty()) slot->info.missing = d.isa;
            slot->info.cpu_supports = ok;
            vs->slots.push_back(std::move(slot));
        }
        return vs;
    }();
    return *v;
}

// Loads a variant library (once) and records why when it cannot. Never called for a variant
// the CPU cannot run: its static initializers could already use the missing instructions.
void load_variant(VariantSlot& s) {
    if (s.info.name == "base") {
        s.backend = &cpu_kernel_backend();
        return;
    }
    const std::string file = "libkvlab_cpu_" + s.info.name + ".so";
    std::string errors;
    for (const std::string& dir : plugin_dirs()) {
        const std::string path = dir + "/" + file;
        if (access(path.c_str(), R_OK) != 0) continue;
        s.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!s.handle) {
            errors += " " + path + ": " + dlerror() + ";";
            continue;
        }
        using CreateFn = KernelBackend* (*)();
        auto create = reinterpret_cast<CreateFn>(dlsym(s.handle, "kvlab_cpu_backend_create"));
        if (!create) {
            errors += " " + path + ": missing kvlab_cpu_backend_create;";
            continue;
        }
        s.backend = create();
        s.info.built = s.backend != nullptr;
        return;
    }
    s.info.status = errors.empty() ? file + " not found next to the executable or in ../lib/kvlab" : "failed to load:" + errors;
}

VariantSlot* find_slot(const std::string& name) {
    for (auto& s : variants().slots)
        if (s->info.name == name) return s.get();
    return nullptr;
}

KernelBackend* slot_backend(VariantSlot& s) {
    if (!s.info.cpu_supports) return nullptr;
    std::call_once(s.once, [&] { load_variant(s); });
    return s.backend;
}

std::string variant_names() {
    std::string names;
    for (const auto& s : variants().slots) names += (names.empty() ? "" : ", ") + s->info.name;
    return names;
}

void fail(Variants& v, const std::string& error, const std::string& hint) {
    v.choice.backend = nullptr;
    v.choice.error = error;
    v.choice.hint = hint;
}

void choose_variant(Variants& v) {
#if defined(KVLAB_NATIVE_BUILD)
    // -march=native: the built-in backend is specific to the building machine, and no
    // variant libraries exist.
    if (const char* env = std::getenv("KVLAB_CPU_VARIANT"); env && *env && std::string(env) != "native")
        return fail(v, "KVLAB_CPU_VARIANT=" + std::string(env) + ": this kvlab was built with KVLAB_NATIVE=ON, which has no kernel variants",
                    "unset KVLAB_CPU_VARIANT, or build without -DKVLAB_NATIVE=ON");
    v.choice.backend = &cpu_kernel_backend();
    v.choice.status = "native (built with -march=native for the building machine; no run-time variants)";
    return;
#endif
    if (const char* env = std::getenv("KVLAB_CPU_VARIANT"); env && *env) {
        const std::string want = env;
        VariantSlot* s = find_slot(want);
        if (!s) return fail(v, "KVLAB_CPU_VARIANT=" + want + ": unknown kernel variant; expected one of " + variant_names(), "");
        if (!s->info.cpu_supports) {
            std::string runnable;
            for (auto& o : v.slots)
                if (o->info.cpu_supports) runnable += std::string(runnable.empty() ? "" : ", ") + o->info.name;
            return fail(v, "KVLAB_CPU_VARIANT=" + want + ": this CPU cannot run it (it lacks " + s->info.missing + "; the variant needs " +
                               s->info.isa + ")",
                        "variants this CPU runs: " + runnable);
        }
        KernelBackend* b = slot_backend(*s);
        if (!b) return fail(v, "KVLAB_CPU_VARIANT=" + want + ": the variant library is not available: " + s->info.status,
                            "rebuild with it in KVLAB_CPU_VARIANTS, or pick another variant");
        v.choice.backend = b;
        v.choice.status = want + " (forced by KVLAB_CPU_VARIANT; needs " + s->info.isa + ")";
        return;
    }
    std::string skipped;
    for (auto& s : v.slots) {
        if (!s->info.cpu_supports) {
            skipped += "; " + s->info.name + ": CPU lacks " + s->info.missing;
            continue;
        }
        if (KernelBackend* b = slot_backend(*s)) {
            v.choice.backend = b;
            v.choice.status = s->info.name + " (best this CPU runs: " + s->info.isa + skipped + ")";
            return;
        }
        skipped += "; " + s->info.name + ": " + s->info.status;
    }
    v.choice.backend = &cpu_kernel_backend();  // unreachable: base is always there
    v.choice.status = "base";
}
}  // namespace

const VariantChoice& chosen_variant() {
    Variants& v = variants();
    std::call_once(v.chosen_once, [&] { choose_variant(v); });
    return v.choice;
}

std::vector<VariantInfo> variants_info() {
    std::vector<VariantInfo> out;
#if defined(KVLAB_NATIVE_BUILD)
    out.push_back({"native", "-march=native (the building machine)", true, {}, true, {}});
    return out;
#endif
    for (auto& s : variants().slots) {
        slot_backend(*s);  // loads it when the CPU can run it, filling built/status
        out.push_back(s->info);
    }
    return out;
}

KernelBackend* variant_backend(const std::string& name) {
#if defined(KVLAB_NATIVE_BUILD)
    return name == "native" ? &cpu_kernel_backend() : nullptr;
#endif
    VariantSlot* s = find_slot(name);
    return s ? slot_backend(*s) : nullptr;
}

}  // namespace kv::cpu
