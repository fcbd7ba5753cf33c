// `kvlab`: the headless entry point. Everything the GUI does can be done from here; this file
// only dispatches to commands and turns errors into one message and an exit code
// (0 ok, 1 run-time error, 2 usage error, 3 run finished degraded: telemetry lost, 130
// cancelled; process_main.cpp). Links no Qt and no benchmark (`kvlab bench` runs kvlab-bench).
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"
#include "commands_storage.h"
#include "process_main.h"
#include "engine/core/join.h"
#include "engine/core/run_mode.h"

namespace kv::cli {

namespace {
void print_usage(FILE* out) {
    std::fprintf(out,
                 "kvlab — a lab for KV-cache policies in large language models\n\n"
                 "usage: kvlab COMMAND [options]\n\n"
                 "commands:\n"
                 "  eval_long MODEL  evaluate a cache policy over long samples (loss, accuracy, perplexity)\n"
                 "  infer MODEL      like eval_long, printing every sample\n"
                 "  generate MODEL   generate text from --prompt, streamed as it is decoded\n"
                 "  finetune_long_lora MODEL     train LoRA adapters with the cache policy in place (--lora.qlora: NF4 base)\n"
                 "  finetune_long_full MODEL     train every weight\n"
                 "  finetune_offload_lora MODEL  as finetune_long_lora, weights/gradients/optimizer state in host memory\n"
                 "  finetune_offload_full MODEL  as finetune_long_full, weights/gradients/optimizer state in host memory\n"
                 "  runs FILE        the runs recorded in a session file\n"
                 "  compare FILE     runs side by side: config diff, metrics, ratios to a reference\n"
                 "  sweep MODEL      a grid of eval_long runs (comma lists of options) with a dense reference, table and figure\n"
                 "  plot FILE        a metric of a session's runs against an option, as SVG, PNG or PDF\n"
                 "  export FILE      a run's memory / spans / metrics as CSV, Chrome trace or PyTorch snapshot\n"
                 "  sql FILE QUERY   a read-only SQL query or a named one (kvlab sql --list) on a session\n"
                 "  diff FILE A B    where two runs' time and memory differ: spans, phases, peak per category\n"
                 "  calibrate duo MODEL -o FILE  DuoAttention's per-head gates (retrieval vs streaming heads)\n"
                 "  calibrate qfilter MODEL --data FILE -o FILE  Q-Filters: each KV head's main query direction\n"
                 "  bench ops|model|cache|telemetry   ratios of our speed to this machine's ceilings\n"
                 "  list WHAT        policies, buffers, modes or presets of this build (--format tsv|json for scripts)\n"
                 "  version          version, build options and available backends\n"
                 "  help             this text\n\n"
                 "global options:\n%s\n"
                 "Run `kvlab COMMAND --help` for a command's own options.\n",
                 format_options(global_options()).c_str());
}
}  // namespace

int run(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
        print_usage(stdout);
        return argc < 2 ? 2 : 0;
    }
    std::string cmd = argv[1];
    if (cmd == "bench") return cmd_bench(argc, argv, 2);
    if (const RunModeInfo* m = find_run_mode(cmd))
        return m->kind == RunKind::GENERATE ? cmd_generate(argc, argv, 2) : cmd_eval(argc, argv, 2, cmd);
    if (cmd == "runs") return cmd_runs(argc, argv, 2);
    if (cmd == "export") return cmd_export(argc, argv, 2);
    if (cmd == "sql") return cmd_sql(argc, argv, 2);
    if (cmd == "diff") return cmd_diff(argc, argv, 2);
    if (cmd == "compare") return cmd_compare(argc, argv, 2);
    if (cmd == "sweep") return cmd_sweep(argc, argv, 2);
    if (cmd == "plot") return cmd_plot(argc, argv, 2);
    if (cmd == "calibrate") return cmd_calibrate(argc, argv, 2);
    if (cmd == "version" || cmd == "--version") return cmd_version(argc, argv, 2);
    if (cmd == "list") return cmd_list(argc, argv, 2);
    std::fprintf(stderr, "kvlab: unknown command '%s'; expected one of: %s, runs, compare, sweep, plot, export, sql, diff, calibrate, bench, list, version, help\n",
                 cmd.c_str(), join(run_mode_names(), ", ").c_str());
    return 2;
}

}  // namespace kv::cli

int main(int argc, char** argv) { return kv::cli::guarded_main(argc, argv, kv::cli::run); }
