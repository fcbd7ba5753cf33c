// `kvlab version`: version, build options and which backends are usable here.
#include <cstdio>
#include <string>

#include "commands.h"
#include "engine/backend/backend_registry.h"
#include "engine/dist/communicator.h"
#include "engine/telemetry/gpu_tracer.h"

namespace kv::cli {

int cmd_version(int argc, char** argv, int first) {
    Args args(argc, argv, first, global_options());
    apply_global_options(args);
    std::printf("kvlab %s\n", KVLAB_VERSION);
    std::printf("cpu backend: %s, %d threads\n", cpu_backend().build_info().c_str(), num_threads());
    std::printf("cpu kernels: %s\n", cpu_variant_status().c_str());
    std::string list;
    for (const CpuVariant& v : cpu_variants()) {
        list += list.empty() ? "" : ", ";
        list += v.name;
        if (!v.cpu_supports) list += " (not this CPU)";
        else if (!v.built) list += " (not built: " + v.status + ")";
    }
    std::printf("cpu variants: %s\n", list.c_str());
    std::printf("cuda backend: %s\n", cuda_status().c_str());
    if (const std::string d = cuda_status_detail(); !d.empty()) std::printf("  (cuda: %s)\n", d.c_str());
    std::printf("gpu tracer (CUPTI): %s\n", trace::gpu_tracer_plugin_status().c_str());
    std::string dist;
    for (const auto& b : dist::available_backends()) dist += (dist.empty() ? "" : ", ") + b;
    std::printf("dist backends: %s (docs/DISTRIBUTED.md)\n", dist.c_str());
    return 0;
}

}  // namespace kv::cli
