// `kvlab export FILE --run N --what memory|spans|metrics|tokens|all --format csv|chrome-trace|perfetto|torch-snapshot
// -o PATH`: writes one run's recording for other tools (spreadsheets, chrome://tracing and
// ui.perfetto.dev, pytorch.org/memory_viz). Reads the session read-only; never overwrites it.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "commands_storage.h"
#include "engine/core/error.h"
#include "storage/exports.h"
#include "storage/session_reader.h"

namespace kv::cli {

namespace {
std::vector<OptionSpec> export_options() {
    auto o = global_options();
    o.push_back({"run", OptKind::INT, "the only run", "run id to export (see kvlab runs FILE)"});
    o.push_back({"what", OptKind::STRING, "memory", "memory, spans, metrics, tokens (csv only: each sample's token ids, text and loss), or all (chrome-trace and perfetto only)"});
    o.push_back({"format", OptKind::STRING, "csv", "csv, chrome-trace, perfetto or torch-snapshot (memory only)"});
    o.push_back({"output", OptKind::STRING, "", "output file (also -o PATH)"});
    o.push_back({"allow-incomplete", OptKind::FLAG, "",
                 "export a run whose telemetry is incomplete (events lost to a full disk, crashed, failed)"});
    return o;
}

void print_help() {
    std::printf(
        "usage: kvlab export FILE --run N --what memory|spans|metrics|tokens|all --format csv|chrome-trace|perfetto|torch-snapshot -o "
        "PATH\n\n"
        "Exports one run of a session file:\n"
        "  csv             one table (memory events, spans or metrics) with integer nanoseconds\n"
        "  chrome-trace    JSON for chrome://tracing and ui.perfetto.dev: spans per thread, GPU work per\n"
        "                  stream, memory per category as counters\n"
        "  perfetto        the same JSON shaped for ui.perfetto.dev: spans nested per thread, and a flow\n"
        "                  arrow from each launching span to its GPU kernels (CUPTI correlation)\n"
        "  torch-snapshot  PyTorch memory snapshot pickle for pytorch.org/memory_viz\n\n"
        "options:\n%s",
        format_options(export_options()).c_str());
}

// Why a run's recording is not whole ("" when it is): lost or dropped events, or a run that
// did not finish normally.
std::string incomplete_reason(const storage::RunInfo& r) {
    nlohmann::json j = nlohmann::json::parse(r.summary.empty() ? "{}" : r.summary, nullptr, false);
    uint64_t lost = 0, dropped = 0;
    if (j.is_object()) {
        if (j.contains("events_lost") && j["events_lost"].is_number_unsigned()) lost = j["events_lost"].get<uint64_t>();
        if (j.contains("dropped_total") && j["dropped_total"].is_number_unsigned())
            dropped = j["dropped_total"].get<uint64_t>();
    }
    std::string why;
    if (lost) why = str(lost, " telemetry events lost while writing");
    if (dropped) why += str(why.empty() ? "" : ", ", dropped, " events dropped (queues full)");
    using storage::RunStatus;
    if (r.status == RunStatus::DEGRADED || r.status == RunStatus::FAILED || r.status == RunStatus::CRASHED) {
        const std::string st = str("status ", storage::run_status_name(r.status), r.error.empty() ? "" : " (" + r.error + ")");
        why = why.empty() ? st : str(why, "; ", st);
    } else if (r.status == RunStatus::RUNNING && !r.owner_alive) {
        // Its process is gone without recording an end (killed, or the end did not fit on disk).
        const std::string st = "status running, but its process is gone without recording the run's end";
        why = why.empty() ? st : str(why, "; ", st);
    }
    return why;
}
}  // namespace

int cmd_export(int argc, char** argv, int first) {
    // "-o PATH" is the conventional spelling; the option parser only knows "--name".
    std::vector<std::string> storage_args(argv, argv + argc);
    for (size_t i = size_t(first); i < storage_args.size(); ++i)
        if (storage_args[i] == "-o") storage_args[i] = "--output";
    std::vector<char*> av;
    for (auto& s : storage_args) av.push_back(s.data());
    Args args(int(av.size()), av.data(), first, export_options());
    if (args.flag("help")) {
        print_help();
        return 0;
    }
    apply_global_options(args);
    if (args.positional().size() != 1)
        throw UsageError(args.positional().empty()
                             ? "export: missing the session file; expected: kvlab export FILE --run N --what memory "
                               "--format csv -o PATH"
                             : "export: expected one session file, got " + std::to_string(args.positional().size()) +
                                   " arguments (" + args.positional()[1] + " ...)");
    storage::ExportWhat what;
    storage::ExportFormat format;
    try {
        what = storage::export_what_from_name(args.str("what", "memory"));
        format = storage::export_format_from_name(args.str("format", "csv"));
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    const std::string out = args.str("output");
    if (out.empty()) throw UsageError("export: missing the output file; expected -o PATH");
    if (format == storage::ExportFormat::CHROME_TRACE && what == storage::ExportWhat::TOKENS)
        throw UsageError("--what tokens is a table, not a trace; expected --format csv");
    if ((format == storage::ExportFormat::CSV && what == storage::ExportWhat::ALL) ||
        (format == storage::ExportFormat::TORCH_SNAPSHOT && what != storage::ExportWhat::MEMORY))
        throw UsageError(format == storage::ExportFormat::CSV
                             ? "--what all cannot be one CSV file; expected --what memory, spans or metrics"
                             : "--format torch-snapshot holds memory only; expected --what memory");
    const std::string path = args.positional()[0];
    storage::SessionReader reader(path);
    int64_t run = 0;
    if (args.has("run")) {
        run = args.integer("run", 0, 1, INT64_MAX);
    } else {
        auto runs = reader.runs();
        if (runs.size() != 1)
            throw UsageError(str("export: session '", path, "' has ", runs.size(),
                                 " runs; choose one with --run N (kvlab runs ", path, " lists them)"));
        run = runs[0].id;
    }
    // An export of a run with lost events would look complete to whoever reads it: refuse
    // unless asked for, and name what is missing either way.
    const std::string incomplete = incomplete_reason(reader.run(run));
    if (!incomplete.empty()) {
        if (!args.flag("allow-incomplete"))
            throw Error(str("run ", run, " of session '", path, "' is incomplete: ", incomplete,
                            "; nothing exported"),
                        "pass --allow-incomplete to export what was recorded anyway");
        std::fprintf(stderr, "kvlab export: warning: run %lld is incomplete: %s\n", (long long)run,
                     incomplete.c_str());
    }
    storage::ExportResult res = storage::export_run(reader, run, what, format, out);
    std::printf("wrote %s: %llu records, %s\n", out.c_str(), (unsigned long long)res.records,
                format_bytes(int64_t(res.bytes)).c_str());
    return 0;
}

}  // namespace kv::cli
