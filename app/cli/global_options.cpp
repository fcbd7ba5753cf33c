// The options every command accepts (commands.h): threads, memory budget, device.
#include <string>

#include "commands.h"
#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"

namespace kv::cli {

std::vector<OptionSpec> global_options() {
    return {
        {"threads", OptKind::INT, "0 = all cores", "CPU worker threads for kernels"},
        {"memory.budget", OptKind::SIZE, "", "memory budget for the run's device, e.g. 8GiB; allocations beyond it fail"},
        {"device", OptKind::STRING, "cpu", "compute device: cpu or cuda:N"},
        {"help", OptKind::FLAG, "", "show help for this command"},
    };
}

void apply_global_options(const Args& args) {
    int threads = int(args.integer("threads", 0, 0, 1024));
    try {
        set_num_threads(threads);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    const long long budget = args.has("memory.budget") ? args.size("memory.budget", -1) : -1;
    Device d;
    try {
        d = parse_device(args.str("device", "cpu"));
    } catch (const Error& e) {
        throw UsageError(std::string("--device: ") + e.what());
    }
    if (args.has("memory.budget")) default_memory_tracker().set_budget(d, budget);
}

}  // namespace kv::cli
