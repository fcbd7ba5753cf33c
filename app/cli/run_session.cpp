// CLI runs recorded into sessions (see run_session.h).
#include "run_session.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "commands.h"
#include "engine/core/error.h"
#include "engine/memory/mem_category.h"
#include "progress.h"
#include "run_options.h"
#include "sessions/run_manager.h"
#include "storage/session.h"

namespace kv::cli {

namespace {
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted.store(true); }

void print_memory(const nlohmann::json& summary) {
    if (!summary.contains("memory")) return;
    for (auto it = summary["memory"].begin(); it != summary["memory"].end(); ++it) {
        const auto& d = it.value();
        std::printf("peak memory on %s: total %s |", it.key().c_str(), format_bytes(d.value("peak_total", 0LL)).c_str());
        if (d.contains("peak"))
            for (auto c = d["peak"].begin(); c != d["peak"].end(); ++c)
                std::printf(" %s %s", c.key().c_str(), format_bytes(c.value().get<long long>()).c_str());
        std::printf("\n");
    }
}
}  // namespace

int run_mode_in_session(const Args& args, const std::string& mode) {
    RunConfig cfg = run_config_from_args(args, mode);
    const std::string path = args.has("session") ? args.str("session") : sessions::default_session_path();
    std::fprintf(stderr, "kvlab %s: recording into session %s\n", mode.c_str(), path.c_str());
    Progress progress(mode);
    std::atomic<int64_t> shown{0};
    sessions::RunEvents ev;
    ev.progress = [&](int64_t, int64_t d, int64_t t, const std::string& w) { progress.update(d, t, w); };
    ev.output = [&](int64_t, const std::string& text) {
        if (mode == "generate") {
            std::fwrite(text.data(), 1, text.size(), stdout);
            std::fflush(stdout);
        } else if (mode == "infer" || mode.rfind("finetune_", 0) == 0) {
            progress.finish();
            std::printf("  %s\n", text.c_str());
        }
        shown.fetch_add(1);
    };
    sessions::RunManager rm(path, ev);
    for (int64_t id : rm.crashed_at_open()) std::fprintf(stderr, "kvlab: run %lld of this session had crashed earlier\n", (long long)id);
    int64_t run = 0;
    try {
        run = rm.submit(cfg);
    } catch (const storage::SessionError&) {
        throw;  // the session could not record it (disk full, ...): not a usage error
    } catch (const Error& e) {
        throw UsageError(e.what());
    }
    std::signal(SIGINT, on_sigint);
    bool cancel_sent = false;
    while (!storage::run_status_final(rm.status(run))) {
        if (g_interrupted.load() && !cancel_sent) {
            std::fprintf(stderr, "\nkvlab: cancelling run %lld (it stops within one chunk)\n", (long long)run);
            rm.cancel(run);
            cancel_sent = true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const storage::RunStatus st = rm.wait(run);
    std::signal(SIGINT, SIG_DFL);
    progress.finish();
    if (mode == "generate") std::printf("\n");
    // What this process knows: the session may not have been able to record it (disk full).
    const std::string why = rm.message(run);
    if (st == storage::RunStatus::FAILED) throw Error(why.empty() ? "the run failed" : why);
    storage::RunInfo info = rm.session().run(run);
    nlohmann::json summary = nlohmann::json::parse(info.summary.empty() ? "{}" : info.summary, nullptr, false);
    if (summary.is_discarded()) summary = nlohmann::json::object();
    if (mode != "generate") std::printf("result: %s\n", rm.result_text(run).c_str());
    else
        std::fprintf(stderr, "[%lld prompt tokens, %lld generated, %.1f tokens/s, stopped: %s]\n",
                     (long long)summary.value("prompt_tokens", 0LL), (long long)summary.value("generated_tokens", 0LL),
                     summary.value("tokens_per_s", 0.0), summary.value("stop_reason", std::string("?")).c_str());
    if (mode != "generate") print_memory(summary);
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
