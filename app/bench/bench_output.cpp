// Where a `kvlab bench` table goes: stdout always, --csv FILE and --md FILE when asked.
#include <cstdio>
#include <fstream>

#include "bench_commands.h"
#include "engine/core/error.h"

namespace kv::cli {

void emit_bench_table(const Args& args, const bench::BenchTable& t) {
    std::fputs(t.text().c_str(), stdout);
    std::fflush(stdout);
    if (args.has("csv")) {
        std::ofstream f(args.str("csv"));
        if (!(f << t.csv())) throw Error("--csv: cannot write '" + args.str("csv") + "'; expected a writable file path");
    }
    if (args.has("md")) {
        // Appended: scripts/performance.sh collects every benchmark's section in one file.
        std::ofstream f(args.str("md"), std::ios::app);
        if (!(f << t.markdown(bench::table_caption())))
            throw Error("--md: cannot append to '" + args.str("md") + "'; expected a writable file path");
    }
}

}  // namespace kv::cli
