// `kvlab`: the headless entry point. Everything the GUI does can be done from here; this file
// only dispatches to commands and turns errors into one message and an exit code
// (0 ok, 1 run-time error, 2 usage error, 3 run finished degraded: telemetry lost, 130
// cancelled). Links no Qt.
#include <malloc.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "commands.h"
#include "commands_storage.h"
#include "engine/core/join.h"
#include "engine/core/run_mode.h"
#include "engine/backend/backend_registry.h"
#include "engine/core/device.h"
#include "engine/core/error.h"
#include "engine/memory/memory_tracker.h"

namespace kv::cli {

std::vector<OptionSpec> global_options() {
    return {
        {"threads", OptKind::INT, "0 = all cores", "CPU worker threads for kernels"},
        {"memory.budget", OptKind::SIZE, "", "memory budget for the run's device, e.g. 8GiB; allocations beyond it fail"},
        {"device", OptKind::STRING, "cpu", "compute device: cpu or cuda:N"},
        {"help", OptKind::FLAG, "", "show help for this command"},
    };
}

void apply_global_options(const Args& args) {
    int threads = int(args.integer("threads", 0, 0, 1024));
    try {
        set_num_threads(threads);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    const long long budget = args.has("memory.budget") ? args.size("memory.budget", -1) : -1;
    Device d;
    try {
        d = parse_device(args.str("device", "cpu"));
    } catch (const Error& e) {
        throw UsageError(std::string("--device: ") + e.what());
    }
    if (args.has("memory.budget")) default_memory_tracker().set_budget(d, budget);
}

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

// OpenMP worker threads spin between parallel regions by default. On a machine shared with
// other work (2 cores here) that spinning steals the time slices the main thread needs: a tiny
// model ran 5x slower under load. libgomp reads OMP_WAIT_POLICY when it loads, before main(),
// so when the user has not chosen a policy we set PASSIVE and re-execute once.
static void prefer_passive_openmp(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") || std::getenv("KVLAB_NO_REEXEC")) return;
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    setenv("KVLAB_NO_REEXEC", "1", 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then carry on as we are
}

// Activations and logits are large, short-lived and re-allocated every chunk. Above glibc's
// mmap threshold each one would be fresh zeroed pages (page faults cost ~15% of a prefill), so
// keep freed blocks in the heap for reuse instead.
static void keep_freed_memory_for_reuse() {
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

int main(int argc, char** argv) {
    // A file-size limit (ulimit -f) must fail the write that crosses it with EFBIG, which
    // storage reports like a full disk, instead of killing the process.
    std::signal(SIGXFSZ, SIG_IGN);
    prefer_passive_openmp(argv);
    keep_freed_memory_for_reuse();
    try {
        return kv::cli::run(argc, argv);
    } catch (const kv::cli::UsageError& e) {
        std::fprintf(stderr, "kvlab: %s\n", e.what());
        return 2;
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "kvlab: error: out of memory (an allocation failed)\n"
                             "  hint: lower the cache length, sequence length or batch, or set --memory.budget\n");
        return 1;
    } catch (const kv::Error& e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        if (!e.hint().empty()) std::fprintf(stderr, "  hint: %s\n", e.hint().c_str());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kvlab: error: %s\n", e.what());
        return 1;
    }
}
