// `kvlab runs FILE`: one line per run -- id, name, status, mode, policy, buffer, cache length,
// chunk size, progress, loss, peak memory, tokens/s -- plus why failed or crashed runs ended. Opening
// read-write marks runs whose process died as crashed; a read-only session is still listed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "commands_storage.h"
#include "engine/core/error.h"
#include "storage/comparison.h"
#include "storage/config_fields.h"
#include "storage/rank_runs.h"
#include "storage/session.h"
#include "storage/session_reader.h"

namespace kv::cli {

namespace {
std::vector<OptionSpec> runs_options() {
    auto o = global_options();
    o.push_back({"json", OptKind::FLAG, "", "print the runs as JSON (config and summary included)"});
    return o;
}

void print_help() {
    std::printf(
        "usage: kvlab runs FILE [options]\n\n"
        "Lists the runs of a session file: status, configuration, progress, loss, peak memory and throughput.\n"
        "Runs left 'running' by a process that no longer exists are marked crashed.\n\n"
        "options:\n%s",
        format_options(runs_options()).c_str());
}

// "42% (…)"; a run that stopped early says how, as the GUI does ("cancelled at 19% (…)"), and
// percentages are floored: 99.6% of a cancelled run is not "100%".
std::string progress_text(const storage::RunProgress& p, storage::RunStatus status) {
    const bool stopped = status == storage::RunStatus::CANCELLED || status == storage::RunStatus::FAILED ||
                         status == storage::RunStatus::CRASHED;
    auto pct = [&](int64_t done, int64_t total) {
        const std::string v = str(int(std::floor(100.0 * double(done) / double(total))), "%");
        return stopped ? str(storage::run_status_name(status), " at ", v) : v;
    };
    if (p.tokens_total > 0)
        return str(pct(p.tokens_done, p.tokens_total), " (", p.tokens_done, "/", p.tokens_total, " tok)");
    if (p.chunks_total > 0)
        return str(pct(p.chunks_done, p.chunks_total), " (", p.chunks_done, "/", p.chunks_total, " chunks)");
    if (p.steps_total > 0)
        return str(pct(p.steps_done, p.steps_total), " (", p.steps_done, "/", p.steps_total, " steps)");
    return "-";
}

struct SummaryNumbers {
    int64_t peak_bytes = -1;
    double tokens_per_s = -1;
    double loss = NAN;  // evaluation: mean loss; training: the last step's loss
    uint64_t dropped = 0;
};

SummaryNumbers summary_numbers(const std::string& summary) {
    SummaryNumbers s;
    nlohmann::json j = nlohmann::json::parse(summary, nullptr, false);
    if (!j.is_object()) return s;
    s.peak_bytes = storage::run_own_peak_bytes(summary);  // the run's own (no instrumentation), as the app shows it
    if (j.contains("tokens_per_s") && j["tokens_per_s"].is_number()) s.tokens_per_s = j["tokens_per_s"].get<double>();
    for (const char* key : {"mean_loss", "final_loss"})
        if (std::isnan(s.loss) && j.contains(key) && j[key].is_number()) s.loss = j[key].get<double>();
    if (j.contains("dropped_total") && j["dropped_total"].is_number_unsigned())
        s.dropped = j["dropped_total"].get<uint64_t>();
    return s;
}

std::string status_text(const storage::RunInfo& r) { return storage::run_status_label(r); }

std::string when(int64_t ms) {
    if (ms <= 0) return "-";
    std::time_t t = std::time_t(ms / 1000);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
    return buf;
}

std::string fit(std::string s, size_t w) {
    if (s.size() > w) s = s.substr(0, w - 1) + "~";
    return s;
}
}  // namespace

int cmd_runs(int argc, char** argv, int first) {
    Args args(argc, argv, first, runs_options());
    if (args.flag("help")) {
        print_help();
        return 0;
    }
    apply_global_options(args);
    if (args.positional().size() != 1)
        throw UsageError(args.positional().empty() ? "runs: missing the session file; expected: kvlab runs FILE"
                                                   : "runs: expected one session file, got " +
                                                         std::to_string(args.positional().size()) + " arguments");
    const std::string path = args.positional()[0];
    std::vector<storage::RunInfo> runs;
    std::vector<int64_t> crashed;
    bool read_only = false;
    std::string why_read_only = "read-only";
    try {
        auto session = storage::Session::open(path);  // marks dead runs crashed, migrates
        crashed = session->crashed_at_open();
        runs = session->runs();
    } catch (const storage::SessionError& e) {
        // Not writable, or no space left to write (a full disk): listing needs neither.
        if (e.kind() != storage::SessionErrorKind::NOT_WRITABLE && e.kind() != storage::SessionErrorKind::IO) throw;
        storage::SessionReader reader(path);  // still list what we can read
        runs = reader.runs();
        read_only = true;
        if (e.kind() == storage::SessionErrorKind::IO) why_read_only = str("opened read-only: ", e.what());
    }
    if (args.flag("json")) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& r : runs) {
            nlohmann::json j;
            j["id"] = r.id;
            j["name"] = r.name;
            j["status"] = storage::run_status_name(r.status);
            j["config"] = nlohmann::json::parse(r.config, nullptr, false);
            // The cache as the table shows it: canonical, also for sessions that stored an alias.
            if (const std::optional<storage::CacheName> cn = storage::run_cache_name(r.config)) {
                j["policy"] = cn->policy;
                j["buffer"] = cn->buffer;
                nlohmann::json& c = j["config"];
                if (c.is_object() && c.contains("kv_cache") && c["kv_cache"].is_object() && c["kv_cache"].contains("name"))
                    c["kv_cache"]["name"] = storage::run_config_value(r.config, "kv_cache.name");
                if (c.is_object() && c.contains("kv_cache.name")) c["kv_cache.name"] = storage::run_config_value(r.config, "kv_cache.name");
            }
            j["summary"] = nlohmann::json::parse(r.summary, nullptr, false);
            // Where it ran: host (cpus, os) and build (version, CPU kernel variant, backends).
            j["host"] = nlohmann::json::parse(r.host.empty() ? "{}" : r.host, nullptr, false);
            j["build"] = nlohmann::json::parse(r.build.empty() ? "{}" : r.build, nullptr, false);
            j["created_ms"] = r.created_ms;
            j["started_ms"] = r.started_ms;
            j["finished_ms"] = r.finished_ms;
            j["progress"] = {{"tokens_done", r.progress.tokens_done}, {"tokens_total", r.progress.tokens_total},
                             {"chunks_done", r.progress.chunks_done}, {"chunks_total", r.progress.chunks_total},
                             {"steps_done", r.progress.steps_done},   {"steps_total", r.progress.steps_total}};
            if (!r.error.empty()) j["error"] = r.error;
            // Data parallelism: the run ids of its ranks' telemetry (index = rank; 0: missing).
            if (const auto rk = storage::rank_runs(runs, r.id); rk.size() > 1) j["rank_runs"] = rk;
            out.push_back(j);
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    // Rank runs (other ranks' telemetry of a data-parallel run) are part of their run: not listed.
    const size_t rank_rows = size_t(std::count_if(runs.begin(), runs.end(), [](const storage::RunInfo& r) { return storage::is_rank_run(r); }));
    std::erase_if(runs, [](const storage::RunInfo& r) { return storage::is_rank_run(r); });
    std::printf("session %s: %zu run%s%s\n", path.c_str(), runs.size(), runs.size() == 1 ? "" : "s",
                read_only ? str(" (", why_read_only, "; crashed runs are not marked)").c_str() : "");
    if (rank_rows)
        std::printf("(%zu rank run%s of data-parallel runs not listed: kvlab runs --json lists them)\n", rank_rows, rank_rows == 1 ? "" : "s");
    for (int64_t id : crashed)
        std::printf("run %lld was left running by a process that is gone: marked crashed\n", (long long)id);
    if (runs.empty()) return 0;
    // the name column is as wide as the longest name (up to 48), so names stay readable
    int name_w = 4;
    for (const auto& r : runs) name_w = std::max(name_w, std::min(48, int(r.name.size())));
    // Data-parallel runs (dist.ranks > 1) add a ranks column; other sessions list as before.
    bool any_ranks = false;
    for (const auto& r : runs) {
        const std::string n = storage::run_config_value(r.config, "dist.ranks");
        any_ranks = any_ranks || (!n.empty() && n != "1");
    }
    // task and tokens per sample tell apart runs of one policy; cache 0 is the whole sequence
    // ("all", as the app shows it); peak mem is the run's own (run_own_peak_bytes).
    std::printf("%4s  %-*s %-10s %-18s %-12s %7s %-14s %-8s %7s %6s  %-34s %9s %11s %10s  %s%s\n", "id", name_w, "name", "status", "mode",
                "task", "tokens", "policy", "buffer", "cache", "chunk", "progress", "loss", "peak mem", "tokens/s", "created",
                any_ranks ? "  ranks" : "");
    for (const auto& r : runs) {
        const std::optional<storage::CacheName> cache = storage::run_cache_name(r.config);  // canonical, aliases too
        const storage::CacheName cn = cache.value_or(storage::CacheName{});
        const std::string mode = storage::run_config_value(r.config, "mode");
        const std::string cache_length = storage::run_config_value(r.config, "kv_cache.cache_length");
        const std::string task = storage::run_config_value(r.config, "data.name"), tokens = storage::run_config_value(r.config, "data.seq_length");
        const std::string chunk_size = storage::run_config_value(r.config, "kv_cache.chunk_size");
        SummaryNumbers s = summary_numbers(r.summary);
        char loss[32] = "-";
        if (!std::isnan(s.loss)) std::snprintf(loss, sizeof loss, "%.4f", s.loss);
        std::printf("%4lld  %-*s %-10s %-18s %-12s %7s %-14s %-8s %7s %6s  %-34s %9s %11s %10s  %s", (long long)r.id, name_w,
                    fit(r.name, size_t(name_w)).c_str(), status_text(r).c_str(), fit(mode.empty() ? "-" : mode, 18).c_str(),
                    fit(task.empty() ? "-" : task, 12).c_str(), tokens.empty() ? "-" : tokens.c_str(),
                    fit(!cache ? "-" : cn.policy, 14).c_str(), !cache ? "-" : cn.buffer.c_str(),
                    cache_length.empty() ? "-" : cache_length == "0" ? "all" : cache_length.c_str(), chunk_size.empty() ? "-" : chunk_size.c_str(),
                    progress_text(r.progress, r.status).c_str(), loss, s.peak_bytes >= 0 ? format_bytes(s.peak_bytes).c_str() : "-",
                    s.tokens_per_s >= 0 ? str(int64_t(s.tokens_per_s + 0.5)).c_str() : "-", when(r.created_ms).c_str());
        const std::string ranks = storage::run_config_value(r.config, "dist.ranks");
        std::printf("%s\n", any_ranks ? str("  ", ranks.empty() ? "1" : ranks).c_str() : "");
    }
    for (const auto& r : runs) {
        if (!r.error.empty())
            std::printf("run %lld %s: %s\n", (long long)r.id, storage::run_status_name(r.status), r.error.c_str());
        SummaryNumbers s = summary_numbers(r.summary);
        if (s.dropped)
            std::printf("run %lld: %llu telemetry events were dropped (queues full); its timelines have gaps\n",
                        (long long)r.id, (unsigned long long)s.dropped);
    }
    return 0;
}

}  // namespace kv::cli
