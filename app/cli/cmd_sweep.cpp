// `kvlab sweep MODEL --kv_cache.name h2o,lastrec --kv_cache.cache_length 256,512 ... --session S`:
// a comma list on any run option makes the grid (sessions/sweep_grid.h); every cell is an
// eval_long run recorded into one session; cells the session already holds with the same
// configuration are skipped, so a killed sweep continues where it stopped. One progress bar
// covers the whole grid; the end is a table of the metric and its difference to dense, and
// the default figure next to the session file.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "commands.h"
#include "engine/core/error.h"
#include "plot_commands.h"
#include "policy_file.h"
#include "progress.h"
#include "sweep_all_caches.h"
#include "run_options.h"
#include "sessions/run_manager.h"
#include "sessions/sweep_grid.h"
#include "sessions/sweep_results.h"
#include "sweep_dist.h"
#include "storage/session.h"

namespace kv::cli {

namespace {

// The figure's x axis: stored KV bytes when the cells' slots hold different bytes (other
// buffers or widths, byte budgets: figure_x_is_bytes), the ratio when it is an axis, the kept
// bytes over score thresholds (dms: the kept size is the threshold's outcome), else the cache
// length.
std::string sweep_figure_x(const sessions::SweepSpec& spec, const std::vector<sessions::SweepCell>& cells) {
    std::vector<RunConfig> configs;
    for (const auto& c : cells) configs.push_back(c.cfg);
    if (figure_x_is_bytes(configs)) return "kv_physical_bytes";
    for (const auto& a : spec.axes)
        if (a.option == "kv_cache.ratio" && a.values.size() > 1) return "kv_cache.ratio";
    for (const auto& a : spec.axes)
        if (a.option == "kv_cache.score_threshold" && a.values.size() > 1) return "kv_logical_bytes";
    return "kv_cache.cache_length";
}

std::atomic<bool> g_sweep_interrupted{false};
extern "C" void on_sweep_sigint(int) { g_sweep_interrupted.store(true); }

const char* kSweepOwnOptions[] = {"config", "session", "format", "metric", "figure", "threads", "device", "memory.budget", "help",
                                  "kv_cache.policy_file"};

std::vector<OptionSpec> sweep_option_specs() {
    std::vector<OptionSpec> specs;
    for (auto s : run_option_specs()) {
        if (s.kind == OptKind::INT || s.kind == OptKind::FLOAT) s.kind = OptKind::STRING;  // "256,512" is an axis
        specs.push_back(s);
    }
    specs.push_back({"kv_cache.buffer", OptKind::STRING, "", "sweep: buffers joined to policy names given without one (default,q8,...)"});
    specs.push_back({"kv_cache.ratio", OptKind::STRING, "", "sweep: cache length as a fraction of data.seq_length (0.25,0.5); instead of cache_length"});
    specs.push_back({"format", OptKind::STRING, "table",
                     "result table: table, csv, json, md, or leaderboard (method x kv_cache.ratio, the mean over tasks with standard errors)"});
    specs.push_back({"metric", OptKind::STRING, "auto", "summary metric in the table (auto: perplexity, else copy_token_accuracy, else accuracy, else mean_loss; "
                     "with --fidelity true also fidelity_kept_mass, fidelity_attn_rel_error, fidelity_next_token_kl, fidelity_efficiency)"});
    specs.push_back({"figure", OptKind::STRING, "SESSION.svg", "figure of the metric vs cache length, or vs stored KV bytes when the buffers differ or a byte budget is set (none: no figure)"});
    return specs;
}

bool is_own_option(const std::string& name) {
    for (const char* o : kSweepOwnOptions)
        if (name == o) return true;
    return false;
}

void print_sweep_help() {
    const auto all = sweep_option_specs();
    const std::vector<OptionSpec> own(all.end() - 5, all.end());
    std::printf(
        "usage: kvlab sweep MODEL --OPTION v1,v2,... [--OPTION v ...] --session FILE [--format table|csv|json|md|leaderboard]\n\n"
        "Runs eval_long for every combination of the options given as comma lists (the grid), plus one\n"
        "dense reference per data configuration, all recorded into one session. Cells the session already\n"
        "holds with the same configuration are skipped: rerun the same command to continue a stopped sweep\n"
        "or just to print its table again. Policy names without a buffer take --kv_cache.buffer (default).\n"
        "--kv_cache.name all: every registered policy that can run the rest of the command (its protocol,\n"
        "buffer and first value of each axis; under compress-then-ask a trial compression on MODEL); the\n"
        "others are listed with the reason before anything runs.\n\n"
        "example: kvlab sweep smollm2-135m --data repeat --kv_cache.name h2o,lastrec,tova \\\n"
        "             --kv_cache.cache_length 256,512 --kv_cache.chunk_size 64 --session s.kvlab\n\n"
        "sweep options:\n%s\nrun options: every option of `kvlab eval_long --help`, each as a single value or a comma list\n"
        "(list-valued options such as --data.files keep their commas).\n",
        format_options(own).c_str());
}

// The run options in command-line order (Args keeps them sorted by name).
std::vector<std::pair<std::string, std::string>> ordered_run_options(int argc, char** argv, int first, const Args& args) {
    std::vector<std::pair<std::string, std::string>> out;
    for (int i = first; i < argc; ++i) {
        std::string a = argv[i];
        if (a.rfind("--", 0) != 0 || a == "--") continue;
        std::string name = a.substr(2);
        if (auto eq = name.find('='); eq != std::string::npos) name = name.substr(0, eq);
        if (is_own_option(name) || !args.has(name)) continue;
        bool seen = false;
        for (const auto& [n, v] : out) seen = seen || n == name;
        if (!seen) out.push_back({name, args.str(name)});
    }
    return out;
}

RunConfig base_config(const Args& args) {
    RunConfig cfg;
    if (args.has("config")) {
        std::ifstream in(args.str("config"));
        if (!in) throw UsageError(str("--config: cannot read '", args.str("config"), "'; expected a JSON file of run options"));
        std::stringstream ss;
        ss << in.rdbuf();
        try {
            cfg = run_config_from_json(ss.str(), args.str("config"));
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
    }
    cfg.mode = "eval_long";
    cfg.model = args.positional()[0];
    if (args.has("threads")) cfg.threads = args.integer("threads", 0, 0, 1024);
    if (args.has("device")) cfg.device = args.str("device");
    if (args.has("memory.budget")) cfg.memory_budget = args.str("memory.budget");
    return cfg;
}

}  // namespace

int cmd_sweep(int argc, char** argv, int first) {
    Args args(argc, argv, first, sweep_option_specs());
    if (args.flag("help")) {
        print_sweep_help();
        return 0;
    }
    apply_global_options(args);
    if (args.positional().empty()) throw UsageError("sweep: missing MODEL; expected e.g. kvlab sweep tiny --kv_cache.name h2o,lastrec --kv_cache.cache_length 64,128");
    if (args.positional().size() > 1)
        throw UsageError(str("sweep: unexpected argument '", args.positional()[1], "'; options start with --"));
    const std::string format = args.str("format", "table");
    if (format != "table" && format != "csv" && format != "json" && format != "md" && format != "leaderboard")
        throw UsageError(str("--format: '", format, "' is not a table format; expected table, csv, json, md or leaderboard"));

    sessions::SweepSpec spec;
    std::vector<sessions::SweepCell> cells;
    try {
        if (args.has("kv_cache.policy_file")) load_policy_file(args.str("kv_cache.policy_file"));  // before the cache names are parsed
        std::vector<std::pair<std::string, std::string>> options = ordered_run_options(argc, argv, first, args);
        expand_all_caches(base_config(args), options);  // --kv_cache.name all
        spec = sessions::make_sweep_spec(base_config(args), options);
        cells = sessions::expand_sweep(spec);
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    std::string path = args.has("session") ? args.str("session") : sessions::default_session_path();
    // Under mpirun the cells spread over the ranks (sweep_dist.h). A sweep's ranks wait for each
    // other only at the start and the end, so the end waits a day unless --dist.timeout says.
    RunConfig dist_cfg = spec.base;
    if (!args.has("dist.timeout")) dist_cfg.dist.timeout = 86400;
    const DistSetup ds = setup_dist(dist_cfg, "sweep", true);
    const bool spread = ds.active && ds.ranks > 1;
    if (spread && !args.has("session")) throw UsageError("sweep under mpirun: --session FILE is required (every rank must name the same target)");
    const std::string target_path = path;
    if (spread && ds.rank != 0) path = rank_session_path(target_path, ds.rank);

    Progress progress("sweep", stderr, "tokens");
    int64_t current_run = 0;
    std::atomic<double> current_fraction{0};
    sessions::RunEvents ev;
    ev.progress = [&](int64_t, int64_t d, int64_t t, const std::string&) { current_fraction.store(t > 0 ? double(d) / double(t) : 0.0); };
    sessions::RunManager rm(path, ev);
    for (int64_t id : rm.crashed_at_open()) std::fprintf(stderr, "kvlab sweep: run %lld of this session had crashed earlier; its cell runs again\n", (long long)id);

    // Cells to run, weighted by their tokens for the bar and its ETA.
    const auto done = sessions::done_runs_by_identity(rm.session());
    std::vector<const sessions::SweepCell*> pending;
    double total_tokens = 0;
    std::map<size_t, int64_t> rank_runs;  // spread, rank > 0: cell -> its run in this rank's file
    std::vector<size_t> todo;
    for (size_t i = 0; i < cells.size(); ++i)
        if (ds.rank != 0 || !done.count(cells[i].identity)) todo.push_back(i);
    if (spread) todo = share_pending_cells(todo, ds);
    for (size_t i : todo) {
        const auto& c = cells[i];
        if (ds.rank != 0 && done.count(c.identity)) {
            rank_runs[i] = done.at(c.identity);  // this rank ran it before the sweep stopped
            continue;
        }
        pending.push_back(&c);
        total_tokens += double(c.cfg.data.seq_length * c.cfg.data.num_samples);
    }
    if (spread)
        std::fprintf(stderr, "kvlab sweep: rank %d of %d: %zu cells to run into %s\n", ds.rank, ds.ranks, pending.size(), path.c_str());
    else
        std::fprintf(stderr, "kvlab sweep: %zu cells (%zu already in %s), %zu to run\n", cells.size(), cells.size() - pending.size(),
                     path.c_str(), pending.size());

    std::signal(SIGINT, on_sweep_sigint);
    double finished_tokens = 0;
    int failures = 0;
    bool interrupted = false;
    for (size_t i = 0; i < pending.size() && !interrupted; ++i) {
        const auto& cell = *pending[i];
        const double cell_tokens = double(cell.cfg.data.seq_length * cell.cfg.data.num_samples);
        const std::string what = str("cell ", i + 1, "/", pending.size(), ": ", cell.cfg.name);
        current_fraction.store(0);
        try {
            current_run = rm.submit(cell.cfg);
        } catch (const Error& e) {
            throw UsageError(str("sweep cell '", cell.cfg.name, "': ", e.what()));
        }
        bool cancel_sent = false;
        while (!storage::run_status_final(rm.status(current_run))) {
            if (g_sweep_interrupted.load() && !cancel_sent) {
                progress.finish();
                std::fprintf(stderr, "\nkvlab sweep: cancelling run %lld; rerun the same command to continue the sweep\n", (long long)current_run);
                rm.cancel(current_run);
                cancel_sent = interrupted = true;
            }
            const double d = finished_tokens + current_fraction.load() * cell_tokens;
            progress.update((long long)d, (long long)total_tokens, what);
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        const storage::RunStatus st = rm.wait(current_run);
        rank_runs[size_t(&cell - cells.data())] = current_run;
        finished_tokens += cell_tokens;
        if (st == storage::RunStatus::FAILED) {
            progress.finish();
            std::fprintf(stderr, "kvlab sweep: cell '%s' (run %lld) failed: %s\n", cell.cfg.name.c_str(), (long long)current_run,
                         rm.session().run(current_run).error.c_str());
            ++failures;
        }
    }
    std::signal(SIGINT, SIG_DFL);
    progress.finish();
    if (spread) {
        // Every rank's runs into the target session (rank 0 records them).
        const int remote_failures = gather_sweep_runs(cells, ds.rank == 0 ? std::map<size_t, int64_t>{} : rank_runs, rm.session(), path, ds);
        if (ds.rank != 0) return interrupted ? 130 : failures ? 1 : 0;
        failures += remote_failures;
    }

    const sessions::SweepTable table = sessions::make_sweep_table(cells, spec.axes, rm.session(), args.str("metric", "auto"));
    if (format == "leaderboard") {
        try {
            std::printf("%s", sessions::format_sweep_leaderboard(table).c_str());
        } catch (const Error& e) {
            throw UsageError(e.what());
        }
    } else {
        std::printf("%s", sessions::format_sweep_table(table, format).c_str());
    }
    std::fflush(stdout);
    if (interrupted) return 130;

    std::string figure = args.str("figure", "");
    if (figure.empty()) {
        figure = path;
        if (figure.size() > 6 && figure.compare(figure.size() - 6, 6, ".kvlab") == 0) figure.resize(figure.size() - 6);
        figure += ".svg";
    }
    std::string x;
    if (figure != "none") {
        std::vector<int64_t> ids;
        for (const auto& r : table.rows)
            if (r.run) ids.push_back(r.run);
        x = sweep_figure_x(spec, cells);
        std::string by = "kv_cache.name";
        std::string facet;
        for (const auto& a : spec.axes)
            if (a.values.size() > 1 && !sessions::is_cache_option(a.option) && facet.empty()) facet = a.option;
        std::string message;
        if (write_session_figure(rm.session(), ids, x, table.metric, by, facet, figure, &message))
            std::fprintf(stderr, "kvlab sweep: figure %s\n", figure.c_str());
        else
            std::fprintf(stderr, "kvlab sweep: no figure: %s\n", message.c_str());
    }
    if (x.empty()) x = sweep_figure_x(spec, cells);
    std::fprintf(stderr, "kvlab sweep: session %s (kvlab plot %s --x %s --y %s -o fig.pdf)\n", path.c_str(), path.c_str(), x.c_str(),
                 table.metric.c_str());
    return failures ? 1 : 0;
}

}  // namespace kv::cli
