// `kvlab diff FILE RUN_A RUN_B [--format table|md|csv|json]`: where the time and memory of two
// runs differ -- time per span name and GPU kernel, phases, peak bytes per category (whole run and
// per chunk), kept-slot overlap per layer, differing summary numbers (storage/run_diff.h). Read-only.
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "commands_storage.h"
#include "engine/core/error.h"
#include "storage/run_diff.h"

namespace kv::cli {

namespace {
int64_t run_id(const std::string& s, const char* which) {
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end || v <= 0)
        throw UsageError(str("diff: ", which, " '", s, "' is not a run id; expected a positive number"));
    return v;
}
}  // namespace

int cmd_diff(int argc, char** argv, int first) {
    auto specs = global_options();
    specs.push_back({"format", OptKind::STRING, "table", "output: table, md, csv or json"});
    Args args(argc, argv, first, specs);
    if (args.flag("help") || args.positional().size() != 3) {
        std::printf(
            "usage: kvlab diff FILE RUN_A RUN_B [--format table|md|csv|json]\n\n"
            "Where two runs' time and memory differ: total time and count per span name and per GPU kernel,\n"
            "memcpy and memset (by |B-A|), self time per phase, peak bytes per memory category (whole run and\n"
            "per chunk), per layer the cache slots both runs kept, and the summary numbers that differ.\n\noptions:\n%s",
            format_options(specs).c_str());
        if (args.flag("help")) return 0;
        throw UsageError(str("diff: expected a session file and two run ids, got ", args.positional().size(), " argument",
                             args.positional().size() == 1 ? "" : "s"));
    }
    apply_global_options(args);
    storage::ResultFormat format;
    if (!storage::result_format_from_name(args.str("format", "table"), format))
        throw UsageError(str("--format: '", args.str("format"), "' is not a diff format; expected table, md, csv or json"));
    const int64_t a = run_id(args.positional()[1], "RUN_A"), b = run_id(args.positional()[2], "RUN_B");
    storage::SessionReader session(args.positional()[0]);
    const storage::RunDiff d = storage::run_diff(session, a, b);
    if (format == storage::ResultFormat::TABLE || format == storage::ResultFormat::MARKDOWN)
        std::printf("diff of runs %lld (A) and %lld (B) in %s\n\n", (long long)a, (long long)b, args.positional()[0].c_str());
    std::fputs(storage::format_query_result(storage::run_diff_table(d), format).c_str(), stdout);
    return 0;
}

}  // namespace kv::cli
