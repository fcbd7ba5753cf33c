// CLI runs recorded into sessions (see run_session.h).
#include "run_session.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include <unistd.h>

#include "commands.h"
#include "dist_setup.h"
#include "engine/core/run_mode.h"
#include "engine/core/error.h"
#include "engine/memory/mem_category.h"
#include "policy_file.h"
#include "progress.h"
#include "rank_telemetry.h"
#include "run_options.h"
#include "sessions/run_manager.h"
#include "storage/comparison.h"
#include "storage/session.h"

namespace kv::cli {

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

void print_memory(const nlohmann::json& summary) {
    // The run's own peak (storage::run_own_peak_bytes, as kvlab runs / compare / the app show it),
    // with what measuring it added beside it (fidelity), then the evaluation phase's own
    // allocator peaks, named as such (they exclude model loading).
    const int64_t own = storage::run_own_peak_bytes(summary.dump()), all = storage::run_peak_bytes(summary.dump());
    if (own >= 0 && all > own)
        std::printf("peak memory: %s (whole run, every category; %s with the instrumentation that measured it)\n",
                    format_bytes(own).c_str(), format_bytes(all).c_str());
    else if (own >= 0)
        std::printf("peak memory: %s (whole run, every category)\n", format_bytes(own).c_str());
    if (!summary.contains("memory")) return;
    for (auto it = summary["memory"].begin(); it != summary["memory"].end(); ++it) {
        const auto& d = it.value();
        // The run's own numbers, as the headline; what instrumentation added after them.
        const bool split = d.contains("peak_total_without_instrumentation") && d.contains("peak_without_instrumentation");
        const auto& cats = split ? d["peak_without_instrumentation"] : d.value("peak", nlohmann::json::object());
        std::printf("evaluation-phase peak on %s%s: total %s |", it.key().c_str(), split ? " (the run's own)" : "",
                    format_bytes(split ? d["peak_total_without_instrumentation"].get<long long>() : d.value("peak_total", 0LL)).c_str());
        for (auto c = cats.begin(); c != cats.end(); ++c)
            if (c.value().get<long long>() > 0) std::printf(" %s %s", c.key().c_str(), format_bytes(c.value().get<long long>()).c_str());
        if (d.value("peak_instrumentation", 0LL) > 0)
            std::printf(" | instrumentation %s", format_bytes(d["peak_instrumentation"].get<long long>()).c_str());
        if (d.contains("process_peak_rss"))
            std::printf(" | process peak RSS %s", format_bytes(d["process_peak_rss"].get<long long>()).c_str());
        std::printf("\n");
    }
}

// Prefill and decode apart: a single generated token comes from the prefill's logits, so it has
// no decode speed (dividing by its sampling time would report thousands of tokens/s).
void print_generate_stats(const nlohmann::json& s) {
    std::string line = str("[", s.value("prompt_tokens", 0LL), " prompt tokens, ", s.value("generated_tokens", 0LL), " generated");
    char buf[64];
    if (s.contains("prefill_tokens_per_s")) {
        std::snprintf(buf, sizeof buf, "%.1f", s["prefill_tokens_per_s"].get<double>());
        line += str(" | prefill ", buf, " tokens/s");
    }
    if (s.contains("decode_tokens_per_s")) {
        std::snprintf(buf, sizeof buf, "%.1f", s["decode_tokens_per_s"].get<double>());
        line += str(" | decode ", buf, " tokens/s over ", s.value("decode_forwards", 0LL), " steps");
        if (s.value("decode_evicting_forwards", 0LL) > 0) line += str(" (", s.value("decode_evicting_forwards", 0LL), " evicted a slot)");
    } else {
        line += " | decode: no steps (the token came from the prefill)";
    }
    line += str(" | stopped: ", s.value("stop_reason", std::string("?")), "]");
    std::fprintf(stderr, "%s\n", line.c_str());
}
}  // namespace

int run_mode_in_session(const Args& args, const std::string& mode) {
    if (args.has("kv_cache.policy_file")) load_policy_file(args.str("kv_cache.policy_file"));  // before kv_cache.name is parsed
    RunConfig cfg = run_config_from_args(args, mode);
    // Data parallelism (mpirun): rank 0 records into the session and prints; every other rank
    // runs the same training into a private session removed at exit, sent to rank 0 at the end
    // and imported as that rank's run (rank_telemetry.h; docs/DISTRIBUTED.md).
    const RunModeInfo& mode_info = run_mode(mode);
    const bool generates = mode_info.kind == RunKind::GENERATE, trains = mode_info.kind == RunKind::TRAIN;
    const DistSetup ds = setup_dist(cfg, mode, trains);
    const bool quiet_rank = ds.rank != 0;
    const std::string format = args.str("format", "text");
    if (format != "text" && format != "json")
        throw UsageError(str("--format: '", format, "' is not an output format; expected text or json"));
    const bool json = format == "json";
    // generate without --session: the text is the product, so the run goes into a temporary
    // session removed on exit rather than a new file per call under ~/.local/share/kvlab.
    const bool ephemeral = (generates && !args.has("session")) || quiet_rank;
    const std::string path = quiet_rank ? (std::filesystem::temp_directory_path() / str("kvlab-rank", ds.rank, "-", getpid(), ".kvlab")).string()
                             : args.has("session") ? args.str("session")
                             : ephemeral ? (std::filesystem::temp_directory_path() / str("kvlab-generate-", getpid(), ".kvlab")).string()
                                         : sessions::default_session_path();
    std::error_code ec;
    auto remove_session_files = [&] {
        for (const char* suffix : {"", "-wal", "-shm", "-journal"}) std::filesystem::remove(path + suffix, ec);
    };
    if (ephemeral) remove_session_files();  // a leftover of an earlier process with this pid
    struct RemoveOnExit {
        std::function<void()> remove;
        ~RemoveOnExit() {
            if (remove) remove();
        }
    } ephemeral_cleanup{ephemeral ? std::function<void()>(remove_session_files) : nullptr};  // after rm closes it
    // A command refused before its run computed anything leaves no new file behind.
    const bool existed = std::filesystem::exists(path, ec);
    if (!ephemeral) std::fprintf(stderr, "kvlab %s: recording into session %s\n", mode.c_str(), path.c_str());
    Progress progress(mode, stderr, mode_info.kind == RunKind::EVALUATE ? "layer × chunk steps" : "");
    std::atomic<bool> started{false};
    bool ends_with_newline = true;
    sessions::RunEvents ev;
    ev.progress = [&](int64_t, int64_t d, int64_t t, const std::string& w) {
        started.store(true);
        if (!quiet_rank) progress.update(d, t, w);
    };
    ev.output = [&](int64_t, const std::string& text) {
        started.store(true);
        if (quiet_rank) return;
        if (generates) {
            if (json || text.empty()) return;  // the text is in the JSON summary
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
            ends_with_newline = text.back() == '\n';
        } else if (!mode_info.reports_loss || trains) {
            progress.finish();
            std::fprintf(json ? stderr : stdout, "  %s\n", text.c_str());
        }
    };
    std::optional<sessions::RunManager> rm;
    rm.emplace(path, ev);
    auto discard_new_session = [&] {
        if (existed || started.load()) return;
        rm.reset();  // closes the file
        remove_session_files();
        if (!ephemeral) std::fprintf(stderr, "kvlab %s: no run started; session %s not kept\n", mode.c_str(), path.c_str());
    };
    for (int64_t id : rm->crashed_at_open()) std::fprintf(stderr, "kvlab: run %lld of this session had crashed earlier\n", (long long)id);
    int64_t run = 0;
    try {
        run = rm->submit(cfg);
    } catch (const storage::SessionError&) {
        throw;  // the session could not record it (disk full, ...): not a usage error
    } catch (const Error& e) {
        discard_new_session();
        throw UsageError(e.what());
    }
    std::signal(SIGINT, on_sigint);
    bool cancel_sent = false;
    while (!storage::run_status_final(rm->status(run))) {
        if (g_interrupted.load() && !cancel_sent) {
            std::fprintf(stderr, "\nkvlab: cancelling run %lld (it stops within one chunk)\n", (long long)run);
            rm->cancel(run);
            cancel_sent = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const storage::RunStatus st = rm->wait(run);
    std::signal(SIGINT, SIG_DFL);
    progress.finish();
    // The statistics go on their own line after the text (stdout is flushed before stderr speaks).
    if (generates && !json && !ends_with_newline) std::printf("\n");
    std::fflush(stdout);
    // What this process knows: the session may not have been able to record it (disk full).
    const std::string why = rm->message(run);
    if (ds.ranks > 1 && trains) {
        // Every rank's spans and memory events into the run's session (rank_telemetry.h); a
        // rank's file travels closed.
        if (quiet_rank) rm.reset();
        share_rank_telemetry(ds, path, run, st);
    }
    if (st == storage::RunStatus::FAILED) {
        discard_new_session();
        throw Error(why.empty() ? "the run failed" : why);
    }
    if (quiet_rank) return st == storage::RunStatus::DONE || st == storage::RunStatus::DEGRADED ? 0 : 130;
    storage::RunInfo info = rm->session().run(run);
    nlohmann::json summary = nlohmann::json::parse(info.summary.empty() ? "{}" : info.summary, nullptr, false);
    if (summary.is_discarded()) summary = nlohmann::json::object();
    if (json) {
        // The session's summary as stored: doubles print with round-trip precision.
        nlohmann::json out;
        out["run"] = run;
        out["session"] = ephemeral ? nlohmann::json() : nlohmann::json(path);
        out["status"] = storage::run_status_name(st);
        out["summary"] = summary;
        std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (!generates) {
        std::printf("result: %s\n", rm->result_text(run).c_str());
        print_memory(summary);
    } else {
        print_generate_stats(summary);
    }
    std::fflush(stdout);
    if (ephemeral)
        std::fprintf(stderr, "run %s; not recorded (--session FILE records it)\n", storage::run_status_name(st));
    else
        std::fprintf(stderr, "run %lld %s in %s (kvlab runs %s; kvlab export %s --run %lld ...)\n", (long long)run,
                     storage::run_status_name(st), path.c_str(), path.c_str(), path.c_str(), (long long)run);
    if (st == storage::RunStatus::DEGRADED) {
        // Its numbers stand, its telemetry is incomplete: one line naming the cause, exit 3.
        std::fprintf(stderr, "kvlab: run %lld degraded: %s\n", (long long)run, why.c_str());
        return 3;
    }
    return st == storage::RunStatus::DONE ? 0 : 130;
}

}  // namespace kv::cli
