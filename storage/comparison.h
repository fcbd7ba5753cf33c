// Comparisons are first-class: a set of runs of one session plus a reference run (e.g. dense),
// with the configuration fields that differ and derived metrics — differences in
// loss/accuracy/perplexity and ratios of memory, KV bytes and throughput to the reference.
// Computed from a read-only SessionReader (runs and their summaries), so the GUI and the CLI
// compare without a write connection.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "storage/session_reader.h"

namespace kv::storage {

struct ComparedRun {
    int64_t id = 0;
    std::string name, status;
    std::string error;  // why it failed / crashed / degraded ("" otherwise)
    std::vector<std::pair<std::string, std::string>> config_diff;  // fields differing from the reference
    double loss = NAN, accuracy = NAN, perplexity = NAN, tokens_per_s = NAN;  // tokens/s: the run's own speed
    double kv_bytes = NAN, peak_bytes = NAN, seconds = NAN;                   // peak: the run's own (run_own_peak_bytes)
    // The bytes of the slots kept (logical) and what the buffers hold for them (physical: whole
    // paged blocks, whole per-head pools), where the run records them.
    double kv_logical_bytes = NAN, kv_physical_bytes = NAN;
    // The task's own numbers and the fidelity means, where the run records them (NaN otherwise):
    // copied tokens (repeat), answer tokens right (RULER), next-token KL, kept attention mass and
    // its efficiency against the oracle (the best set of the same size).
    double copy_token_accuracy = NAN, answer_token_accuracy = NAN, fidelity_kl = NAN, fidelity_kept_mass = NAN,
           fidelity_attn_error = NAN, fidelity_efficiency = NAN;
    // With what measured the run (fidelity): NaN when the run had no instrumentation.
    double peak_bytes_with_instrumentation = NAN, tokens_per_s_with_instrumentation = NAN, instrumentation_seconds = NAN;
    std::vector<std::pair<std::string, double>> peak_by_category;  // bytes, from the run's summary (cpu device)
    std::vector<std::pair<std::string, double>> phase_seconds;     // the summary's phase_seconds (run_phase.h names)
    // relative to the reference (NaN when either side is missing)
    double d_loss = NAN, d_accuracy = NAN, ppl_ratio = NAN, speed_ratio = NAN, kv_ratio = NAN, peak_ratio = NAN;
};

struct Comparison {
    int64_t reference = 0;
    std::vector<ComparedRun> runs;  // reference first
    std::vector<std::string> differing_fields;
};

// Throws kv::Error for unknown run ids or an empty selection.
// THE peak memory of a run, the one number every printer shows (eval_long, kvlab runs, kvlab
// compare, the GUI runs table; the memory timeline, CSV and Chrome-trace exports reach the same
// value as the maximum device_total of the allocation events): the tracked allocator's peak over
// the whole run, every category, the largest over devices — the writer's "peak_bytes" of the
// run summary, raised to the largest per-phase allocator peak ("memory") should dropped events
// have hidden the top (or a run was recorded without events). -1 when neither is known.
int64_t run_peak_bytes(const std::string& summary_json);
// The run's own peak: as run_peak_bytes, without instrumentation (fidelity's shadow cache and its
// dense reference and KL passes, AllocEvent::instrumentation) -- the headline every printer
// shows, with run_peak_bytes beside it when they differ. Runs recorded before instrumentation
// was told apart: run_peak_bytes.
int64_t run_own_peak_bytes(const std::string& summary_json);

Comparison compare_runs(SessionReader& session, const std::vector<int64_t>& runs, int64_t reference);
// A text table (what `kvlab compare` prints).
std::string format_comparison(const Comparison& c);

}  // namespace kv::storage
