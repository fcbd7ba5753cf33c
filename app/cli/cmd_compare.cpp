// `kvlab compare FILE --runs 1,2,3 [--reference 1]`: runs of a session side by side.
#include <cstdio>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/core/split.h"
#include "storage/comparison.h"
#include "storage/session.h"
#include "storage/session_reader.h"

namespace kv::cli {

int cmd_compare(int argc, char** argv, int first) {
    auto specs = global_options();
    specs.push_back({"runs", OptKind::STRING, "all", "comma-separated run ids"});
    specs.push_back({"reference", OptKind::INT, "the first run", "run the others are compared with (e.g. the dense one)"});
    Args args(argc, argv, first, specs);
    if (args.flag("help") || args.positional().empty()) {
        std::printf("usage: kvlab compare FILE [RUN ...] [--runs 1,2,3] [--reference N]\n\n%s",
                    format_options(specs).c_str());
        return args.flag("help") ? 0 : 2;
    }
    // Read-only: comparing needs neither write permission nor free disk space.
    storage::SessionReader session(args.positional()[0]);
    std::vector<int64_t> ids;
    // Run ids given after FILE count like --runs (never silently ignored).
    std::string listed;
    for (size_t i = 1; i < args.positional().size(); ++i) listed += (listed.empty() ? "" : ",") + args.positional()[i];
    if (!listed.empty() && args.has("runs"))
        throw UsageError("compare: runs given both after FILE and with --runs; expected one of the two");
    if (args.has("runs") || !listed.empty()) {
        for (const std::string& one : split(args.has("runs") ? args.str("runs") : listed)) {
            char* end = nullptr;
            long long id = std::strtoll(one.c_str(), &end, 10);
            if (one.empty() || *end) throw UsageError("--runs: '" + one + "' is not a run id; expected numbers like 1,2,3");
            ids.push_back(id);
        }
    } else {
        for (const auto& r : session.runs()) ids.push_back(r.id);
    }
    const int64_t ref = args.integer("reference", 0, 0, INT64_MAX);
    storage::Comparison c = storage::compare_runs(session, ids, ref);
    std::printf("%s", storage::format_comparison(c).c_str());
    return 0;
}

}  // namespace kv::cli
