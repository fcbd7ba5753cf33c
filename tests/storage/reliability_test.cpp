// Faults that must never pass silently (issue 17): a writer that cannot write (file-size limit
// standing in for a full disk) tells its run within the failing batch; `degraded` is a final
// status older files migrate to; two processes creating one session both succeed; a file left
// half-created is repaired; a run queued by a process that died is marked crashed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "engine/telemetry/trace.h"
#include "storage/schema.h"
#include "storage/session.h"
#include "storage/session_file.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::RunStatus;
using storage::Session;

int wait_child(pid_t pid) {
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

TEST(Reliability, DegradedIsAFinalStatusThatAVersion2SessionMigratesTo) {
    test::ScratchDir dir;
    const std::string path = dir.file("v2.kvlab");
    int64_t done = 0;
    {
        auto s = Session::create(path);
        done = s->create_run("earlier");
        s->start_run(done);
        s->finish_run(done, RunStatus::DONE, "");
    }
    // Make it a version-2 file: the runs table with version 2's status CHECK (no 'degraded').
    {
        storage::Db db(path, SQLITE_OPEN_READWRITE);
        std::string sql = db.query_text("SELECT sql FROM sqlite_schema WHERE name='runs'", "", "t");
        const std::string v3 = ",'degraded'";
        ASSERT_NE(sql.find(v3), std::string::npos) << sql;
        sql.erase(sql.find(v3), v3.size());
        sql.replace(sql.find("runs("), 5, "runs_v2(");
        db.exec(sql + "; INSERT INTO runs_v2 SELECT * FROM runs; DROP TABLE runs; ALTER TABLE runs_v2 RENAME TO runs;"
                      "PRAGMA user_version=2; UPDATE meta SET value='2' WHERE key='schema_version';",
                "t");
        EXPECT_NE(sqlite3_exec(db.handle(), "UPDATE runs SET status='degraded'", nullptr, nullptr, nullptr), SQLITE_OK)
            << "the version-2 CHECK should refuse 'degraded'";
    }
    auto s = Session::open(path);  // migrates 2 -> 3
    EXPECT_EQ(s->run(done).status, RunStatus::DONE);
    EXPECT_EQ(s->run(done).name, "earlier");
    const int64_t r = s->create_run("lost telemetry");
    s->start_run(r);
    s->finish_run(r, RunStatus::DEGRADED, "disk full while writing session X: 720 telemetry events lost");
    EXPECT_EQ(s->run(r).status, RunStatus::DEGRADED);
    EXPECT_TRUE(storage::run_status_final(RunStatus::DEGRADED));
    EXPECT_EQ(storage::run_status_from_name("degraded"), RunStatus::DEGRADED);
    EXPECT_STREQ(storage::run_status_name(RunStatus::DEGRADED), "degraded");
    EXPECT_EQ(s->integrity_check(), "ok");
    storage::SessionReader reader(path);
    EXPECT_EQ(reader.run(r).status, RunStatus::DEGRADED);
    EXPECT_NE(reader.run(r).error.find("720 telemetry events lost"), std::string::npos);
}

// Child: writes metrics under a file-size limit until the writer reports a fault; reports on the
// pipe how many events had been lost when it was told and the error text length. Exit codes:
// 0 told, 4 never told.
[[noreturn]] void child_under_size_limit(const std::string& path, int out_fd) {
    try {
        signal(SIGXFSZ, SIG_IGN);
        auto session = Session::open(path);
        const int64_t run = session->create_run("full disk", R"({"mode":"eval_long"})");
        session->start_run(run);
        std::atomic<uint64_t> lost_when_told{0};
        std::atomic<bool> told{false};
        std::string error;
        storage::WriterOptions wo;
        wo.batch_rows = 2000;
        wo.on_fault = [&](int64_t id, uint64_t lost, const std::string& e) {
            if (id != run || told.exchange(true)) return;
            lost_when_told = lost;
            error = e;
        };
        storage::SessionWriter writer(path, wo);
        trace::Recorder rec;
        writer.attach(run, rec);
        // The WAL may grow by ~1 MiB from here; the events below need far more.
        struct stat st {};
        ::stat(path.c_str(), &st);
        struct rlimit rl {};
        rl.rlim_cur = rl.rlim_max = rlim_t(st.st_size) + (1 << 20);
        setrlimit(RLIMIT_FSIZE, &rl);
        uint64_t pushed = 0;
        {
            trace::RecorderScope scope(rec);
            static const trace::Name kStep("step");
            for (int64_t step = 0; step < 2000000 && !told.load(); ++step) {
                trace::metric(kStep, step, double(step));
                ++pushed;
                while (rec.stats().pending > 20000 && !told.load()) std::this_thread::yield();
            }
        }
        writer.detach(run);
        int64_t report[3] = {int64_t(told.load()), int64_t(lost_when_told.load()), int64_t(pushed)};
        ssize_t n = write(out_fd, report, sizeof report);
        (void)n;
        std::fprintf(stderr, "[child] writer error: %s\n", error.c_str());
        _exit(told.load() ? 0 : 4);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "child failed: %s\n", e.what());
    }
    _exit(3);
}

TEST(Reliability, AFullDiskIsReportedToTheRunWithinOneBatch) {
    test::ScratchDir dir;
    const std::string path = dir.file("full.kvlab");
    Session::create(path).reset();
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(p[0]);
        child_under_size_limit(path, p[1]);
    }
    close(p[1]);
    int64_t report[3] = {0, 0, 0};
    ASSERT_EQ(read(p[0], report, sizeof report), ssize_t(sizeof report));
    close(p[0]);
    ASSERT_EQ(wait_child(pid), 0) << "the writer never reported the failed writes";
    EXPECT_EQ(report[0], 1);
    // Told at the first failed commit: at most one batch (plus what was drained with it) lost.
    EXPECT_GT(report[1], 0);
    EXPECT_LE(report[1], 2 * 2000 + 20000) << "the fault was reported only after " << report[1] << " lost events";
    EXPECT_LT(report[2], 2000000) << "the producer was never stopped";
    std::printf("[ info ] told after %lld lost events, %lld pushed\n", (long long)report[1], (long long)report[2]);
    // Listing the session needs no space: a reader opens it and the run is there.
    storage::SessionReader r(path);
    EXPECT_EQ(r.runs().size(), 1u);
}

TEST(Reliability, ConcurrentCreatorsBothSucceedAndBothRunsAreRecorded) {
    test::ScratchDir dir;
    for (int round = 0; round < 10; ++round) {
        const std::string path = dir.file("race" + std::to_string(round) + ".kvlab");
        int go[2];
        ASSERT_EQ(pipe(go), 0);
        pid_t kids[2];
        for (pid_t& k : kids) {
            k = fork();
            ASSERT_GE(k, 0);
            if (k == 0) {
                close(go[1]);
                char c;
                ssize_t n = read(go[0], &c, 1);  // start together
                (void)n;
                try {
                    auto s = Session::open_or_create(path);
                    int64_t run = s->create_run(str("creator ", getpid()));
                    s->start_run(run);
                    s->finish_run(run, RunStatus::DONE);
                    _exit(0);
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "creator failed: %s\n", e.what());
                    _exit(1);
                }
            }
        }
        close(go[0]);
        ASSERT_EQ(write(go[1], "gg", 2), 2);
        close(go[1]);
        EXPECT_EQ(wait_child(kids[0]), 0) << "round " << round;
        EXPECT_EQ(wait_child(kids[1]), 0) << "round " << round;
        storage::SessionReader r(path);
        auto runs = r.runs();
        ASSERT_EQ(runs.size(), 2u) << "round " << round;
        for (const auto& run : runs) EXPECT_EQ(run.status, RunStatus::DONE);
    }
    // No temporary files are left behind.
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
        EXPECT_EQ(e.path().filename().string().find(".creating-"), std::string::npos) << e.path();
}

TEST(Reliability, AHalfCreatedFileIsRepairedOnTheNextOpen) {
    test::ScratchDir dir;
    // What a creator killed mid-way used to leave: an empty file, or SQLite without tables.
    const std::string empty = dir.file("empty.kvlab"), bare = dir.file("bare.kvlab"), other = dir.file("notes.kvlab");
    test::write_file_bytes(empty, "");
    {
        storage::Db db(bare, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
        db.exec("PRAGMA journal_mode=WAL; PRAGMA user_version=0;", "t");
    }
    ASSERT_GT(std::filesystem::file_size(bare), 0u);
    for (const std::string& p : {empty, bare}) {
        auto s = Session::open_or_create(p);
        const int64_t run = s->create_run("after repair");
        EXPECT_EQ(s->run(run).status, RunStatus::QUEUED);
        EXPECT_EQ(s->integrity_check(), "ok");
    }
    // Anything with content is never touched.
    test::write_file_bytes(other, "my notes, not a session");
    EXPECT_FALSE(storage::repair_half_created_session(other));
    EXPECT_THROW(Session::open(other), storage::SessionError);
    EXPECT_EQ(test::read_file_bytes(other), "my notes, not a session");
}

TEST(Reliability, ARunQueuedByAProcessThatDiedIsMarkedCrashed) {
    test::ScratchDir dir;
    const std::string path = dir.file("queued.kvlab");
    int64_t earlier = 0;
    {
        auto s = Session::create(path);
        earlier = s->create_run("finished earlier");
        s->start_run(earlier);
        s->finish_run(earlier, RunStatus::DONE);
    }
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(p[0]);
        auto s = Session::open(path);
        int64_t ids[2] = {s->create_run("queued one"), s->create_run("queued two")};
        ssize_t n = write(p[1], ids, sizeof ids);
        (void)n;
        raise(SIGKILL);  // dies with both runs queued
        _exit(0);
    }
    close(p[1]);
    int64_t ids[2] = {0, 0};
    ASSERT_EQ(read(p[0], ids, sizeof ids), ssize_t(sizeof ids));
    close(p[0]);
    ASSERT_EQ(wait_child(pid), 128 + SIGKILL);
    // A queued run of a live process (this one) stays queued.
    int64_t mine = 0;
    {
        auto s = Session::open(path);
        EXPECT_EQ(s->crashed_at_open(), (std::vector<int64_t>{ids[0], ids[1]}));
        for (int64_t id : ids) {
            EXPECT_EQ(s->run(id).status, RunStatus::CRASHED);
            EXPECT_NE(s->run(id).error.find("ended before it started"), std::string::npos) << s->run(id).error;
        }
        EXPECT_EQ(s->run(earlier).status, RunStatus::DONE);
        mine = s->create_run("mine");
    }
    auto s = Session::open(path);
    EXPECT_TRUE(s->crashed_at_open().empty());
    EXPECT_EQ(s->run(mine).status, RunStatus::QUEUED);
}

}  // namespace
}  // namespace kv
