#include "engine/core/run_mode.h"

#include "engine/core/error.h"
#include "engine/core/join.h"

namespace kv {

const std::vector<RunModeInfo>& run_mode_registry() {
    static const std::vector<RunModeInfo> kModes = {
        {.name = "eval_long", .summary = "evaluate a cache policy on long sequences: loss, task metrics, memory, speed",
         .kind = RunKind::EVALUATE, .supports_fidelity = true},
        {.name = "infer", .summary = "run sequences through the model and the cache, printing what it predicts",
         .kind = RunKind::EVALUATE, .reports_loss = false, .supports_fidelity = true},
        {.name = "generate", .summary = "generate text after a prompt with the cache policy deciding during decoding",
         .kind = RunKind::GENERATE, .reports_loss = false},
        {.name = "finetune_long_lora", .summary = "LoRA fine-tuning with the cache policy in place", .kind = RunKind::TRAIN,
         .lora = true},
        {.name = "finetune_long_full", .summary = "full fine-tuning with the cache policy in place", .kind = RunKind::TRAIN},
        {.name = "finetune_offload_lora", .summary = "LoRA fine-tuning, activations offloaded to host memory",
         .kind = RunKind::TRAIN, .lora = true, .offload = true},
        {.name = "finetune_offload_full", .summary = "full fine-tuning, activations offloaded to host memory",
         .kind = RunKind::TRAIN, .offload = true},
    };
    return kModes;
}

const RunModeInfo* find_run_mode(const std::string& name) {
    for (const RunModeInfo& m : run_mode_registry())
        if (m.name == name) return &m;
    return nullptr;
}

const std::vector<std::string>& run_mode_names() {
    static const std::vector<std::string> kNames = [] {
        std::vector<std::string> n;
        for (const RunModeInfo& m : run_mode_registry()) n.push_back(m.name);
        return n;
    }();
    return kNames;
}

const RunModeInfo& run_mode(const std::string& name) {
    if (const RunModeInfo* m = find_run_mode(name)) return *m;
    throw Error(str("mode '", name, "' is not a run mode; expected one of ", join(run_mode_names(), ", ")));
}

}  // namespace kv
