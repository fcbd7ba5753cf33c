// Exports of one run for other tools: CSV (memory events, spans, metrics), Chrome trace JSON
// (spans as complete events per thread / GPU stream, memory per category as counter tracks,
// metrics as counters) and PyTorch memory snapshot pickles (pytorch.org/memory_viz,
// pickle.load). They read only through SessionReader and write files atomically (temporary
// file, then rename); they never overwrite an SQLite database such as a session.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "storage/session_reader.h"

namespace kv::storage {

// TOKENS: each evaluated sample's tokens (id, text, loss per position), CSV only.
enum class ExportWhat { MEMORY, SPANS, METRICS, ALL, TOKENS };
enum class ExportFormat { CSV, CHROME_TRACE, PERFETTO, TORCH_SNAPSHOT };
// Parse "memory|spans|metrics|tokens|all" and "csv|chrome-trace|perfetto|torch-snapshot"; throw kv::Error naming
// the valid values.
ExportWhat export_what_from_name(const std::string& name);
ExportFormat export_format_from_name(const std::string& name);

struct ExportResult {
    uint64_t records = 0;  // rows / trace events / snapshot entries written
    uint64_t bytes = 0;    // size of the output file
};

// Writes `what` of `run` as `format` to `out_path`. Throws kv::Error for combinations that do
// not exist (a CSV of everything, a torch snapshot of spans), an unknown run, or an output path
// that would overwrite an SQLite database.
ExportResult export_run(SessionReader& reader, int64_t run, ExportWhat what, ExportFormat format,
                        const std::string& out_path);

// Stream versions (what export_run writes); each returns the number of records.
uint64_t export_memory_csv(SessionReader& reader, int64_t run, std::ostream& out);
uint64_t export_spans_csv(SessionReader& reader, int64_t run, std::ostream& out);
uint64_t export_metrics_csv(SessionReader& reader, int64_t run, std::ostream& out);
// One row per (sample, position): sample,position,token_id,piece,loss (loss empty where unscored).
uint64_t export_tokens_csv(SessionReader& reader, int64_t run, std::ostream& out);
uint64_t export_chrome_trace(SessionReader& reader, int64_t run, bool spans, bool memory, bool metrics,
                             std::ostream& out);
// Perfetto's JSON trace event format (ui.perfetto.dev opens it): nested tracks per thread, GPU
// streams per device, and a flow from each launching span to its GPU work (CUPTI correlation).
uint64_t export_perfetto_trace(SessionReader& reader, int64_t run, bool spans, bool memory, bool metrics,
                               std::ostream& out);
uint64_t export_torch_snapshot(SessionReader& reader, int64_t run, std::ostream& out);

// CSV field quoting (RFC 4180): quoted when it holds a comma, quote, CR or LF.
std::string csv_field(const std::string& s);

}  // namespace kv::storage
