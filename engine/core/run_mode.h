// The one table of run modes (`kvlab eval_long`, `generate`, `finetune_long_lora`, ...): what
// each mode does, as flags every layer reads instead of comparing mode names. It lives in the
// core, like the buffer table, because storage and the views classify stored runs by it.
#pragma once

#include <string>
#include <vector>

namespace kv {

enum class RunKind {
    EVALUATE,  // stream a dataset through the model and the cache: losses and metrics
    GENERATE,  // decode new tokens after a prompt
    TRAIN,     // fine-tune with the cache policy in place (gradients through its decisions)
};

struct RunModeInfo {
    std::string name = {};     // the CLI command and the stored "mode"
    std::string summary = {};  // one line for help texts
    RunKind kind = RunKind::EVALUATE;
    bool reports_loss = true;     // evaluation with losses and task metrics (eval_long), not only outputs (infer)
    bool lora = false;            // TRAIN: adapters only (else every weight)
    bool offload = false;         // TRAIN: activations offloaded to host memory between passes
    bool supports_fidelity = false;  // --fidelity (a dense shadow beside the cache)

    bool reads_dataset() const { return kind != RunKind::GENERATE; }
};

// Every mode, in display order (eval_long first: the default).
const std::vector<RunModeInfo>& run_mode_registry();
// nullptr when unknown.
const RunModeInfo* find_run_mode(const std::string& name);
// The mode called `name`; throws kv::Error naming the modes there are.
const RunModeInfo& run_mode(const std::string& name);
// The names of run_mode_registry(), in order.
const std::vector<std::string>& run_mode_names();

}  // namespace kv
