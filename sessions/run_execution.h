// Executing one run's configuration on the calling thread: load the model, run the mode
// (eval_long, infer, generate, finetune_*), and return a JSON summary of what it measured.
// The caller has installed the run's MemoryTracker and telemetry Recorder on this thread.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "engine/run/run_config.h"
#include "storage/rows.h"

namespace kv::sessions {

struct RunHooks {
    // units done / total and what is being worked on (for progress bars and the GUI)
    std::function<void(int64_t done, int64_t total, const std::string& what)> progress;
    // streamed generated text, per-sample lines, log lines
    std::function<void(const std::string& text)> output;
    const std::atomic<bool>* cancel = nullptr;
    // eval_long / infer: each sample's token ids, pieces and per-position loss, once per
    // sample (the caller stores it: one row of the session's sample_tokens table).
    std::function<void(const storage::SampleTokensRow&)> sample_tokens;
};

struct RunOutcome {
    bool cancelled = false;
    std::string summary_json = "{}";  // metrics: loss, accuracy, perplexity, tokens/s, kv bytes, peaks
    std::string text;                 // human-readable result lines
};

// The metric a --fidelity run records per (layer, chunk): "fidelity.<quantity>.layer<l>",
// quantity attn_rel_error, kept_mass, and with fidelity_oracle oracle_mass and efficiency
// (engine/driver/fidelity.h).
std::string fidelity_metric_name(const std::string& quantity, int layer);
// ... and per chunk (no layer: it compares the model's final distributions), at the same steps.
inline constexpr const char* kFidelityKLMetric = "fidelity.next_token_kl";

// Throws kv::Error for failures (the caller marks the run failed with the message).
RunOutcome execute_run(const RunConfig& cfg, const RunHooks& hooks);

}  // namespace kv::sessions
