// Run manager: runs reach the right final status with their summary recorded, events arrive in
// order, cancel works for queued and running runs (a running one stops within one chunk), bad
// configurations fail with the CLI's message without killing the worker, and a run left running
// by a process killed with SIGKILL is marked crashed when the session is opened again.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <fcntl.h>

#include "engine/backend/backend_registry.h"
#include "engine/core/error.h"
#include "engine/model/presets.h"
#include "engine/run/run_config.h"
#include "storage/comparison.h"
#include "sessions/run_manager.h"
#include "storage/session.h"
#include "storage/session_reader.h"

extern char** environ;

namespace kv {
namespace {

using storage::RunStatus;

struct Scratch {
    std::string dir;
    Scratch() {
        std::string t = (std::filesystem::temp_directory_path() / "kvlab-sessions-test-XXXXXX").string();
        std::vector<char> b(t.begin(), t.end());
        b.push_back(0);
        if (!mkdtemp(b.data())) throw std::runtime_error("mkdtemp failed");
        dir = b.data();
    }
    ~Scratch() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    std::string file(const std::string& n) const { return dir + "/" + n; }
};

RunConfig tiny_eval(int64_t seq = 256, int64_t samples = 1) {
    RunConfig c;
    c.mode = "eval_long";
    c.model = "tiny";
    c.data.name = "passkey";
    c.data.seq_length = seq;
    c.data.num_samples = samples;
    c.kv_cache.name = "h2o-default";
    c.kv_cache.cache_length = 64;
    c.driver.chunk_size = 16;
    return c;
}

TEST(RunManager, RunFinishesDoneWithSummaryAndStoredConfig) {
    Scratch s;
    std::mutex mu;
    std::vector<RunStatus> statuses;
    std::vector<std::pair<int64_t, int64_t>> progress;
    sessions::RunEvents ev;
    ev.status = [&](int64_t, RunStatus st, const std::string&) {
        std::lock_guard<std::mutex> lk(mu);
        statuses.push_back(st);
    };
    ev.progress = [&](int64_t, int64_t d, int64_t t, const std::string&) {
        std::lock_guard<std::mutex> lk(mu);
        progress.push_back({d, t});
    };
    const RunConfig cfg = tiny_eval(256, 2);
    int64_t id;
    {
        sessions::RunManager rm(s.file("a.kvlab"), ev);
        id = rm.submit(cfg);
        ASSERT_EQ(rm.wait(id), RunStatus::DONE) << rm.result_text(id);
        const auto sum = nlohmann::json::parse(rm.summary(id));
        // tokens evaluated: each passkey sample fits in seq_length (the filler stops a few
        // tokens short when the next sentence would not fit)
        EXPECT_LE(sum.at("tokens").get<int64_t>(), cfg.data.seq_length * cfg.data.num_samples);
        EXPECT_GE(sum.at("tokens").get<int64_t>(), (cfg.data.seq_length - 32) * cfg.data.num_samples);
        EXPECT_EQ(sum.at("samples").get<int64_t>(), cfg.data.num_samples);
        EXPECT_TRUE(std::isfinite(sum.at("mean_loss").get<double>()));
        EXPECT_GE(sum.at("accuracy").get<double>(), 0.0);
        EXPECT_LE(sum.at("accuracy").get<double>(), 1.0);
    }
    // events: running before done, done last; progress never goes backwards and completes
    ASSERT_GE(statuses.size(), 2u);
    EXPECT_EQ(statuses.back(), RunStatus::DONE);
    EXPECT_NE(std::find(statuses.begin(), statuses.end(), RunStatus::RUNNING), statuses.end());
    ASSERT_FALSE(progress.empty());
    for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].first, progress[i - 1].first);
    const int64_t chunks = (cfg.data.seq_length + cfg.driver.chunk_size - 1) / cfg.driver.chunk_size;  // upper bound
    EXPECT_EQ(progress.back().first, progress.back().second);
    EXPECT_LE(progress.back().second, chunks * preset_config("tiny").num_layers * cfg.data.num_samples);

    // The session remembers the run: status, times, and a config that re-creates the run.
    storage::SessionReader rd(s.file("a.kvlab"));
    const auto info = rd.run(id);
    EXPECT_EQ(info.status, RunStatus::DONE);
    EXPECT_GT(info.started_ms, 0);
    EXPECT_GE(info.finished_ms, info.started_ms);
    const RunConfig back = run_config_from_json(info.config, "stored run");
    EXPECT_EQ(run_config_to_json(back), run_config_to_json(cfg));
    EXPECT_GT(rd.count_rows("spans", id), 0);
    EXPECT_GT(rd.count_rows("cache_steps", id), 0);
}

TEST(RunManager, TelemetryOffRecordsNoEvents) {
    Scratch s;
    RunConfig cfg = tiny_eval();
    cfg.telemetry.enabled = false;
    sessions::RunManager rm(s.file("a.kvlab"));
    const int64_t id = rm.submit(cfg);
    ASSERT_EQ(rm.wait(id), RunStatus::DONE);
    storage::SessionReader rd(s.file("a.kvlab"));
    EXPECT_EQ(rd.count_rows("spans", id), 0);
    EXPECT_EQ(rd.count_rows("memory_events", id), 0);
}

// The GUI keeps read-only connections open beside its RunManager; SQLite deletes the WAL only
// when the last connection closes and a read-only one cannot. Closing the manager folds the WAL
// back and truncates it, so quitting never leaves the run's megabytes beside the session.
TEST(RunManager, ClosingLeavesNoLargeWalBesideOpenReaders) {
    Scratch s;
    const std::string path = s.file("a.kvlab");
    auto rm = std::make_unique<sessions::RunManager>(path);
    storage::SessionReader rd(path);  // the views' and the runs table's connection
    RunConfig cfg = tiny_eval(1024, 2);
    cfg.telemetry.score_interval = 1;  // scores every chunk: megabytes of WAL
    const int64_t id = rm->submit(cfg);
    ASSERT_EQ(rm->wait(id), RunStatus::DONE);
    EXPECT_GT(rd.runs().size(), 0u);
    const auto wal_bytes = [&] {
        std::error_code ec;
        const auto n = std::filesystem::file_size(path + "-wal", ec);
        return ec ? std::uintmax_t(0) : n;
    };
    const std::uintmax_t during = wal_bytes();
    EXPECT_GT(during, std::uintmax_t(1) << 20) << "the run should have written more than 1 MiB of WAL, or this test proves nothing";
    rm.reset();  // quitting: the reader is still open
    EXPECT_LE(wal_bytes(), std::uintmax_t(1) << 20) << "WAL left at " << wal_bytes() << " bytes (was " << during << ")";
    EXPECT_EQ(rd.run(id).status, RunStatus::DONE) << "nothing recorded is lost";
}

// --fidelity measures a run; it must not be counted as the run's cost (issue 37). The same
// configuration with and without fidelity, alternated in one process: the run's own peak is the
// same within 1% and its own speed of the same order (best of seven each, so slow moments of a
// shared machine do not decide it); the instrumented totals are larger and reported apart.
TEST(RunManager, FidelityIsReportedApartFromTheRunsOwnPeakAndSpeed) {
    Scratch s;
    sessions::RunManager rm(s.file("f.kvlab"));
    RunConfig cfg = tiny_eval(2048, 2);
    cfg.data.name = "repeat";
    cfg.data.repeat_length = 32;
    cfg.data.repeat_distance = 1024;
    cfg.kv_cache.cache_length = 512;
    cfg.driver.chunk_size = 128;
    // Telemetry off for the speed: its writer thread shares two cores with the run and its
    // back-pressure lands wherever the queue fills, in or out of the fidelity code.
    cfg.telemetry.enabled = false;
    // One kernel thread: on a loaded two-core machine (CI runs tests two at a time) a second
    // thread's waits would land on whichever run had more parallel regions, not on its own work.
    const int threads = num_threads();
    set_num_threads(1);
    struct Restore {
        int n;
        ~Restore() { set_num_threads(n); }
    } restore{threads};
    // Many short runs, alternated in pairs (fidelity, then plain): each pair's ratio compares
    // two runs under the same load, and the median of the pairs ignores the pairs a burst of
    // other work split. (Best-of per side compares moments apart and drifted to 1.8 under load.)
    constexpr int kReps = 25;
    double best_plain = 0, best_fid = 0, pair_fid = 0;
    std::vector<double> pair_ratios;
    int64_t own_plain = -1, own_fid = -1, all_fid = -1;
    nlohmann::json cat_plain, cat_fid;  // each category's own peak (the evaluation phase's)
    for (int rep = 0; rep < kReps; ++rep)
        for (bool fidelity : {true, false}) {
            cfg.fidelity = fidelity;
            const int64_t id = rm.submit(cfg);
            ASSERT_EQ(rm.wait(id), RunStatus::DONE);
            const std::string summary = rm.session().run(id).summary;
            const nlohmann::json j = nlohmann::json::parse(summary);
            const double tps = j.at("tokens_per_s").get<double>();
            if (fidelity) {
                best_fid = std::max(best_fid, tps);
                pair_fid = tps;
                own_fid = storage::run_own_peak_bytes(summary);
                cat_fid = j.at("memory").at("cpu").at("peak_without_instrumentation");
                all_fid = storage::run_peak_bytes(summary);
                ASSERT_TRUE(j.contains("instrumentation_seconds")) << summary;
                EXPECT_GT(j["instrumentation_seconds"].get<double>(), 0.0);
                EXPECT_LT(j["tokens_per_s_with_instrumentation"].get<double>(), tps) << "measuring costs time";
            } else {
                best_plain = std::max(best_plain, tps);
                pair_ratios.push_back(pair_fid / tps);
                own_plain = storage::run_own_peak_bytes(summary);
                cat_plain = j.at("memory").at("cpu").at("peak_without_instrumentation");
                EXPECT_FALSE(j.contains("instrumentation_seconds")) << "nothing measured: nothing apart";
                EXPECT_EQ(own_plain, storage::run_peak_bytes(summary)) << "without instrumentation the two peaks are one";
            }
        }
    ASSERT_GT(own_plain, 0);
    EXPECT_NEAR(double(own_fid), double(own_plain), 0.01 * double(own_plain)) << "fidelity's memory left out of the run's own peak";
    // Category by category too: fidelity's passes allocate activations and workspace of their
    // own, left out of each category's own peak.
    for (const auto& [cat, v] : cat_plain.items()) {
        ASSERT_TRUE(cat_fid.contains(cat)) << cat;
        EXPECT_NEAR(cat_fid[cat].get<double>(), v.get<double>(), 0.01 * v.get<double>() + 1) << cat;
    }
    EXPECT_GT(all_fid, own_fid) << "the shadow cache is in the instrumented total";
    // The run's own speed is its tokens over its policy pass (run_phase.h). Idle, the ratio is
    // 0.93-0.95 on a 2-core Xeon: the fidelity run's own steps share caches with the measuring
    // between them. Within 15% (issue 37's bound).
    std::sort(pair_ratios.begin(), pair_ratios.end());
    const double ratio = pair_ratios[pair_ratios.size() / 2];
    EXPECT_GT(ratio, 0.85) << "own speed with fidelity / without, median of " << pair_ratios.size() << " pairs";
    EXPECT_LT(ratio, 1.15) << "own speed with fidelity / without, median of " << pair_ratios.size() << " pairs";
    std::printf("[ info ] own tokens/s with / without fidelity: median pair ratio %.3f (best %.4g / %.4g = %.3f); own peak %lld / %lld bytes, "
                "with instrumentation %lld\n",
                ratio, best_fid, best_plain, best_fid / best_plain, (long long)own_fid, (long long)own_plain, (long long)all_fid);
    // kvlab compare leads with the study's numbers: the task's copied tokens and the fidelity
    // means as the summaries hold them, the instrumented totals apart.
    storage::SessionReader rd(s.file("f.kvlab"));
    const storage::Comparison c = storage::compare_runs(rd, {1, 2}, 2);  // the reference is the fidelity run
    ASSERT_EQ(c.runs.size(), 2u);
    const nlohmann::json fid = nlohmann::json::parse(rd.run(1).summary), plain = nlohmann::json::parse(rd.run(2).summary);
    EXPECT_TRUE(fid.at("fidelity_next_token_kl").is_number()) << "run 1 is the first fidelity run";
    EXPECT_EQ(c.runs[0].id, 2);
    EXPECT_EQ(c.runs[0].copy_token_accuracy, plain.at("copy_token_accuracy").get<double>());
    EXPECT_TRUE(std::isnan(c.runs[0].fidelity_kl)) << "a run without fidelity has no KL";
    EXPECT_EQ(c.runs[1].fidelity_kl, fid.at("fidelity_next_token_kl").get<double>());
    EXPECT_EQ(c.runs[1].fidelity_kept_mass, fid.at("fidelity_kept_mass").get<double>());
    EXPECT_EQ(c.runs[1].fidelity_efficiency, fid.at("fidelity_efficiency").get<double>());
    EXPECT_TRUE(std::isnan(c.runs[0].fidelity_efficiency)) << "a run without fidelity has no oracle";
    EXPECT_EQ(c.runs[1].instrumentation_seconds, fid.at("instrumentation_seconds").get<double>());
    const std::string text = storage::format_comparison(c);
    for (const char* want : {"task and fidelity:", "copied tokens", "next-token KL vs dense", "kept attention mass", "efficiency vs oracle",
                             "instrumentation (measuring",
                             "  s fidelity reference", "  s KL heads"})
        EXPECT_NE(text.find(want), std::string::npos) << want << " missing from:\n" << text;
}

// The timeline names every phase of a run (issue 37): the RUN-category spans other than "run"
// itself (load, data, policy pass, fidelity attention, fidelity reference, KL heads, telemetry)
// cover the "run" span but for small gaps, and the summary's phase_seconds add up to the same
// time. The instrumentation phases are the run's instrumentation_seconds, and its own speed is
// its tokens over the policy pass alone.
TEST(RunManager, EveryPhaseOfAFidelityRunIsOnTheTimeline) {
    Scratch s;
    sessions::RunManager rm(s.file("p.kvlab"));
    RunConfig cfg = tiny_eval(512, 2);
    cfg.kv_cache.cache_length = 128;
    cfg.driver.chunk_size = 32;
    cfg.fidelity = true;
    const int64_t id = rm.submit(cfg);
    ASSERT_EQ(rm.wait(id), RunStatus::DONE);
    storage::SessionReader rd(s.file("p.kvlab"));
    std::vector<storage::SpanRow> phases;
    int64_t run0 = -1, run1 = -1;
    for (int64_t after = 0;;) {
        const std::vector<storage::SpanRow> rows = rd.spans(id, {}, after, 100000);
        for (const auto& r : rows) {
            after = std::max(after, r.id);
            if (r.category != trace::SpanCategory::RUN) continue;
            if (r.name == "run") run0 = r.start_ns, run1 = r.end_ns;
            else phases.push_back(r);
        }
        if (rows.empty()) break;
    }
    ASSERT_GT(run1, run0) << "the run span";
    std::set<std::string> names;
    for (const auto& p : phases) names.insert(p.name);
    for (const char* want : {"load", "data", "policy pass", "fidelity attention", "fidelity reference", "KL heads", "telemetry"})
        EXPECT_TRUE(names.count(want)) << "no '" << want << "' phase on the timeline";
    // Union of the phase spans within the run span, by a sweep over the sorted intervals.
    std::sort(phases.begin(), phases.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    // Gaps are named by the phases around them, so that a failure says where time went missing.
    int64_t covered = 0, reach = run0;
    std::string before = "run start", gaps;
    const auto note_gap = [&](int64_t from, int64_t to, const std::string& after) {
        if (to - from > 1000000) gaps += "  " + std::to_string(double(to - from) * 1e-6) + " ms between '" + before + "' and '" + after + "'\n";
    };
    for (const auto& p : phases) {
        const int64_t a = std::max<int64_t>(p.start_ns, reach), b = std::min<int64_t>(p.end_ns, run1);
        note_gap(reach, p.start_ns, p.name);
        if (b > a) covered += b - a;
        if (p.end_ns > reach) reach = p.end_ns, before = p.name;
    }
    note_gap(reach, run1, "run end");
    std::printf("[ info ] gaps over 1 ms:\n%s", gaps.c_str());
    const double run_s = double(run1 - run0) * 1e-9, frac = double(covered) * 1e-9 / run_s;
    EXPECT_GT(frac, 0.98) << "unattributed: " << (1 - frac) * run_s << " s of " << run_s << " s:\n" << gaps;
    std::printf("[ info ] phases cover %.4f of the %.4f s run span\n", frac, run_s);
    const nlohmann::json j = nlohmann::json::parse(rm.session().run(id).summary);
    ASSERT_TRUE(j.contains("phase_seconds")) << j.dump();
    double total = 0, instrumentation = 0;
    for (const auto& [name, v] : j["phase_seconds"].items()) {
        total += v.get<double>();
        if (name == "fidelity attention" || name == "fidelity reference" || name == "KL heads" || name == "telemetry")
            instrumentation += v.get<double>();
    }
    EXPECT_NEAR(total, run_s, 0.03 * run_s) << "exclusive phase seconds add up to the run";
    EXPECT_NEAR(j.at("instrumentation_seconds").get<double>(), instrumentation, 1e-9);
    const double policy = j["phase_seconds"].at("policy pass").get<double>();
    EXPECT_NEAR(j.at("tokens_per_s").get<double>(), double(j.at("tokens").get<int64_t>()) / policy,
                1e-6 * j.at("tokens_per_s").get<double>());
    // Per category apart from instrumentation: kv_fidelity is all instrumentation, the cache all the run's.
    const auto& own = j.at("memory").at("cpu").at("peak_without_instrumentation");
    const auto& all = j.at("memory").at("cpu").at("peak");
    EXPECT_EQ(own.at("kv_fidelity").get<int64_t>(), 0);
    EXPECT_GT(all.at("kv_fidelity").get<int64_t>(), 0);
    EXPECT_EQ(own.at("kv_cache").get<int64_t>(), all.at("kv_cache").get<int64_t>());
    const auto& writer_own = j.at("peak_bytes_by_category_without_instrumentation").at("cpu");
    EXPECT_EQ(writer_own.at("kv_fidelity").get<int64_t>(), 0);
    EXPECT_EQ(writer_own.at("kv_cache").get<int64_t>(), j.at("peak_bytes_by_category").at("cpu").at("kv_cache").get<int64_t>());
}

TEST(RunManager, CancelQueuedRunNeverStarts) {
    Scratch s;
    sessions::RunManager rm(s.file("a.kvlab"));
    const int64_t first = rm.submit(tiny_eval(2048, 2));
    const int64_t second = rm.submit(tiny_eval());
    rm.cancel(second);
    EXPECT_EQ(rm.wait(second), RunStatus::CANCELLED);
    EXPECT_EQ(rm.wait(first), RunStatus::DONE);
    storage::SessionReader rd(s.file("a.kvlab"));
    EXPECT_EQ(rd.run(second).status, RunStatus::CANCELLED);
    EXPECT_EQ(rd.run(second).started_ms, 0);
}

TEST(RunManager, CancelRunningRunStopsWithinOneChunk) {
    Scratch s;
    std::atomic<int64_t> units_at_cancel{-1}, last_units{0};
    std::atomic<bool> cancel_sent{false};
    sessions::RunManager* rmp = nullptr;
    std::atomic<int64_t> run_id{0};
    sessions::RunEvents ev;
    ev.progress = [&](int64_t run, int64_t d, int64_t, const std::string&) {
        last_units = d;
        // cancel from another thread, as the GUI does, once the run is well under way
        if (d >= 40 && !cancel_sent.exchange(true)) {
            units_at_cancel = d;
            std::thread([rmp, run] { rmp->cancel(run); }).join();
        }
    };
    sessions::RunManager rm(s.file("a.kvlab"), ev);
    rmp = &rm;
    RunConfig cfg = tiny_eval(4096, 4);  // far longer than it will get to run
    run_id = rm.submit(cfg);
    EXPECT_EQ(rm.wait(run_id), RunStatus::CANCELLED);
    ASSERT_GE(units_at_cancel.load(), 40);
    // a unit is one layer of one chunk: at most one chunk's layers may follow the request
    EXPECT_LE(last_units.load() - units_at_cancel.load(), preset_config("tiny").num_layers);
    // the worker is still alive for the next run
    const int64_t next = rm.submit(tiny_eval());
    EXPECT_EQ(rm.wait(next), RunStatus::DONE);
}

TEST(RunManager, CancelledTrainingRunSavesAResumableCheckpoint) {
    Scratch s;
    sessions::RunManager* rmp = nullptr;
    std::atomic<bool> cancel_sent{false};
    sessions::RunEvents ev;
    ev.output = [&](int64_t run, const std::string& text) {
        if (text.rfind("step 2:", 0) == 0 && !cancel_sent.exchange(true)) std::thread([rmp, run] { rmp->cancel(run); }).join();
    };
    sessions::RunManager rm(s.file("a.kvlab"), ev);
    rmp = &rm;
    RunConfig cfg = tiny_eval(256, 4);
    cfg.mode = "finetune_long_lora";
    cfg.train.max_steps = 50;
    cfg.train.save_interval = 0;
    cfg.train.out_dir = s.file("out");
    const int64_t id = rm.submit(cfg);
    EXPECT_EQ(rm.wait(id), RunStatus::CANCELLED);
    const auto sum = nlohmann::json::parse(rm.summary(id));
    EXPECT_TRUE(sum.value("cancelled", false));
    EXPECT_EQ(sum.at("steps").get<int64_t>(), 2);
    const std::string ck = sum.at("resume_checkpoint").get<std::string>();
    EXPECT_TRUE(std::filesystem::exists(ck + "/training_state.json")) << ck;
    EXPECT_NE(rm.result_text(id).find("resume with --resume " + ck), std::string::npos) << rm.result_text(id);
}

TEST(RunManager, InvalidConfigIsRejectedAtSubmitWithTheCliMessage) {
    Scratch s;
    sessions::RunManager rm(s.file("a.kvlab"));
    RunConfig cfg = tiny_eval();
    cfg.kv_cache.cache_length = 8;  // smaller than the chunk size
    std::string cli_message;
    try {
        validate_run_config(cfg);
    } catch (const Error& e) {
        cli_message = e.what();
    }
    ASSERT_FALSE(cli_message.empty());
    try {
        rm.submit(cfg);
        FAIL() << "submit accepted an invalid configuration";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()), cli_message);
    }
    EXPECT_TRUE(rm.session().runs().empty());
}

TEST(RunManager, FailingRunIsFailedWithReasonAndWorkerSurvives) {
    Scratch s;
    sessions::RunManager rm(s.file("a.kvlab"));
    RunConfig bad = tiny_eval();
    bad.model = s.file("no-such-model");
    const int64_t id = rm.submit(bad);
    EXPECT_EQ(rm.wait(id), RunStatus::FAILED);
    storage::SessionReader rd(s.file("a.kvlab"));
    EXPECT_NE(rd.run(id).error.find("no-such-model"), std::string::npos) << rd.run(id).error;
    const int64_t good = rm.submit(tiny_eval());
    EXPECT_EQ(rm.wait(good), RunStatus::DONE);
}

// A CLI process killed with SIGKILL mid-run leaves its run "running"; the next RunManager
// to open the session marks it crashed, keeps its committed rows and accepts new runs.
TEST(RunManager, RunOfKilledProcessIsMarkedCrashed) {
    Scratch s;
    const std::string session = s.file("a.kvlab");
    const std::string exe = std::string(KVLAB_BINARY_DIR) + "/bin/kvlab";
    ASSERT_TRUE(std::filesystem::exists(exe)) << exe;
    std::vector<std::string> argv_s = {exe, "eval_long", "tiny", "--data", "passkey", "--data.seq_length",
                                       "8192", "--data.num_samples", "50", "--kv_cache.name", "h2o-default",
                                       "--kv_cache.cache_length", "64", "--kv_cache.chunk_size", "16", "--session", session};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    // wait until the run is running and has committed some spans
    int64_t run = 0, spans = 0;
    for (int i = 0; i < 600 && spans == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (!std::filesystem::exists(session)) continue;
        try {
            storage::SessionReader rd(session);
            auto runs = rd.runs();
            if (runs.empty() || runs[0].status != RunStatus::RUNNING) continue;
            run = runs[0].id;
            spans = rd.count_rows("spans", run);
        } catch (const std::exception&) {
        }
    }
    kill(pid, SIGKILL);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    ASSERT_GT(spans, 0) << "the child never committed spans";
    sessions::RunManager rm(session);
    ASSERT_EQ(rm.crashed_at_open().size(), 1u);
    EXPECT_EQ(rm.crashed_at_open()[0], run);
    storage::SessionReader rd(session);
    EXPECT_EQ(rd.run(run).status, RunStatus::CRASHED);
    EXPECT_GE(rd.count_rows("spans", run), spans);  // everything committed before the kill is kept
    const int64_t next = rm.submit(tiny_eval());
    EXPECT_EQ(rm.wait(next), RunStatus::DONE);
}

// The comparison's diff lists exactly the fields that differ, and its ratios agree with the
// runs' own summaries.
TEST(Comparison, DiffAndRatiosFollowTheSummaries) {
    Scratch s;
    sessions::RunManager rm(s.file("a.kvlab"));
    RunConfig ref = tiny_eval(512, 1);
    ref.kv_cache.name = "dense-default";
    ref.kv_cache.cache_length = 0;
    RunConfig h2o = tiny_eval(512, 1);
    RunConfig last = tiny_eval(512, 1);
    last.kv_cache.name = "lastrec-default";
    const int64_t a = rm.submit(ref), b = rm.submit(h2o), c = rm.submit(last);
    rm.wait_all();
    storage::SessionReader reader(rm.session().path());
    const auto cmp = storage::compare_runs(reader, {b, c, a}, a);
    ASSERT_EQ(cmp.runs.size(), 3u);
    EXPECT_EQ(cmp.runs[0].id, a);  // reference first
    std::set<std::string> fields(cmp.differing_fields.begin(), cmp.differing_fields.end());
    EXPECT_EQ(fields, (std::set<std::string>{"kv_cache.cache_length", "kv_cache.name"}));
    for (const auto& r : cmp.runs) {
        const auto sum = nlohmann::json::parse(rm.summary(r.id));
        const auto rs = nlohmann::json::parse(rm.summary(a));
        EXPECT_NEAR(r.loss, sum.at("mean_loss").get<double>(), 1e-12);
        EXPECT_NEAR(r.kv_ratio, sum.at("kv_bytes").get<double>() / rs.at("kv_bytes").get<double>(), 1e-12);
        EXPECT_NEAR(r.d_loss, sum.at("mean_loss").get<double>() - rs.at("mean_loss").get<double>(), 1e-12);
    }
    EXPECT_LT(cmp.runs[1].kv_ratio, 1.0);  // a 64-slot cache holds less than dense over 512 tokens
    const std::string table = storage::format_comparison(cmp);
    EXPECT_NE(table.find("h2o-default"), std::string::npos);
    EXPECT_NE(table.find("lastrec-default"), std::string::npos);
    // Peak memory by category: each category's whole-run peak as the writer recorded it from the
    // allocation events (issue 16: one whole-run definition; the total row is the run's peak).
    EXPECT_NE(table.find("peak memory by category"), std::string::npos);
    for (const auto& r : cmp.runs) {
        const auto sum = nlohmann::json::parse(rm.summary(r.id));
        const auto& peaks = sum.at("peak_bytes_by_category").at("cpu");
        EXPECT_EQ(r.peak_bytes, sum.at("peak_bytes").at("cpu").get<double>());
        ASSERT_EQ(r.peak_by_category.size(), peaks.size());
        for (const auto& [cat, v] : r.peak_by_category) EXPECT_EQ(v, peaks.at(cat).get<double>()) << cat;
    }
    EXPECT_NE(table.find("kv_cache"), std::string::npos);
    EXPECT_THROW(storage::compare_runs(reader, {a, 999}, a), Error);
    EXPECT_THROW(storage::compare_runs(reader, {}, a), Error);
}

}  // namespace
}  // namespace kv
