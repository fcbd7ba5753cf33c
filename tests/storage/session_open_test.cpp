// Session files: create/open and run lifecycle, and every way a file can be wrong -- missing,
// empty, garbage, another application's SQLite database, truncated, from a newer schema, in a
// read-only directory. Each must give one clear SessionError, never crash, never write a byte
// to the file. Also the forward-migration machinery.
#include <gtest/gtest.h>
#include <chrono>
#include <vector>
#include <thread>
#include <mutex>
#include <atomic>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "storage/schema.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::RunInfo;
using storage::RunStatus;
using storage::Session;
using storage::SessionError;
using storage::SessionErrorKind;
using storage::SessionReader;

// Runs `fn`, expecting a SessionError of `kind` whose message contains `needle`.
template <class Fn>
void expect_session_error(Fn&& fn, SessionErrorKind kind, const std::string& needle) {
    try {
        fn();
        ADD_FAILURE() << "expected a SessionError (" << storage::session_error_kind_name(kind) << ")";
    } catch (const SessionError& e) {
        EXPECT_EQ(e.kind(), kind) << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
        std::printf("[ message ] %s\n", e.what());
    }
}

// Opening `path` every way (read-write, read-only, reader) fails with `kind`, and the file is
// byte-for-byte what it was.
void expect_rejected_untouched(const std::string& path, SessionErrorKind kind, const std::string& needle) {
    const std::string before = test::read_file_bytes(path);
    expect_session_error([&] { Session::open(path); }, kind, needle);
    expect_session_error([&] { SessionReader r(path); }, kind, needle);
    expect_session_error([&] { Session::open_or_create(path); }, kind, needle);
    EXPECT_EQ(test::read_file_bytes(path), before) << "the file was modified";
    EXPECT_FALSE(std::filesystem::exists(path + "-wal") && std::filesystem::file_size(path + "-wal") > 0);
}

TEST(SessionFile, CreateOpenAndRunLifecycle) {
    test::ScratchDir dir;
    const std::string path = dir.file("s.kvlab");
    int64_t a = 0, b = 0;
    {
        auto s = Session::create(path);
        a = s->create_run("dense baseline", R"({"mode":"eval_long","kv_cache.name":"dense"})");
        b = s->create_run("h2o", "{}");
        EXPECT_EQ(s->run(a).status, RunStatus::QUEUED);
        uint64_t t0 = s->start_run(a, R"({"version":"test"})");
        EXPECT_GT(t0, 0u);
        RunInfo r = s->run(a);
        EXPECT_EQ(r.status, RunStatus::RUNNING);
        EXPECT_EQ(r.owner_pid, int64_t(getpid()));
        EXPECT_TRUE(r.owner_alive);
        EXPECT_EQ(r.t0_ns, int64_t(t0));
        EXPECT_NE(r.host.find("hostname"), std::string::npos);
        s->set_progress(a, {.tokens_done = 10, .tokens_total = 40, .chunks_done = 1, .chunks_total = 4});
        s->merge_summary(a, R"({"note":"x","nested":{"k":1}})");
        s->merge_summary(a, R"({"nested":{"j":2}})");
        s->finish_run(a, RunStatus::DONE);
        s->finish_run(b, RunStatus::CANCELLED, "user cancelled");
        // Invalid transitions are named errors.
        expect_session_error([&] { s->start_run(a); }, SessionErrorKind::INVALID, "only a queued run can be started");
        expect_session_error([&] { s->finish_run(a, RunStatus::FAILED); }, SessionErrorKind::INVALID, "already done");
        expect_session_error([&] { s->finish_run(a, RunStatus::RUNNING); }, SessionErrorKind::INVALID,
                             "not a final status");
        expect_session_error([&] { s->run(99); }, SessionErrorKind::INVALID, "has no run 99");
        expect_session_error([&] { s->create_run("bad", "{not json"); }, SessionErrorKind::INVALID, "not valid JSON");
        expect_session_error([&] { s->create_run("bad", "[1,2]"); }, SessionErrorKind::INVALID,
                             "must be a JSON object");
        EXPECT_EQ(s->integrity_check(), "ok");
    }
    auto s = Session::open(path);
    EXPECT_TRUE(s->crashed_at_open().empty());
    auto runs = s->runs();
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0].name, "dense baseline");
    EXPECT_EQ(runs[0].status, RunStatus::DONE);
    EXPECT_EQ(runs[0].progress.tokens_done, 10);
    EXPECT_EQ(runs[0].progress.chunks_total, 4);
    EXPECT_GT(runs[0].finished_ms, 0);
    EXPECT_NE(runs[0].summary.find("\"j\":2"), std::string::npos) << runs[0].summary;
    EXPECT_NE(runs[0].summary.find("\"k\":1"), std::string::npos) << runs[0].summary;
    EXPECT_EQ(runs[1].status, RunStatus::CANCELLED);
    EXPECT_EQ(runs[1].error, "user cancelled");
    EXPECT_EQ(storage::run_status_from_name("crashed"), RunStatus::CRASHED);
    expect_session_error([] { storage::run_status_from_name("paused"); }, SessionErrorKind::INVALID, "paused");
}

TEST(SessionFile, CreateNeverClobbersAnExistingFile) {
    test::ScratchDir dir;
    const std::string path = dir.file("precious.kvlab");
    test::write_file_bytes(path, "my thesis");
    expect_session_error([&] { Session::create(path); }, SessionErrorKind::INVALID, "already exists");
    EXPECT_EQ(test::read_file_bytes(path), "my thesis");
    expect_session_error([&] { Session::create(dir.file("no/such/dir/x.kvlab")); }, SessionErrorKind::NOT_FOUND,
                         "does not exist");
}

TEST(SessionFile, MissingFileIsNamed) {
    test::ScratchDir dir;
    expect_session_error([&] { Session::open(dir.file("nope.kvlab")); }, SessionErrorKind::NOT_FOUND,
                         "nope.kvlab' does not exist");
    expect_session_error([&] { SessionReader r(dir.file("nope.kvlab")); }, SessionErrorKind::NOT_FOUND,
                         "does not exist");
    EXPECT_FALSE(std::filesystem::exists(dir.file("nope.kvlab")));
    expect_session_error([&] { Session::open(dir.path()); }, SessionErrorKind::NOT_A_SESSION, "is a directory");
}

TEST(SessionFile, GarbageEmptyAndForeignFilesAreRejectedUntouched) {
    test::ScratchDir dir;
    std::string garbage(10000, '\0');
    for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = char((i * 7919 + 13) & 0xff);
    test::write_file_bytes(dir.file("garbage.kvlab"), garbage);
    expect_rejected_untouched(dir.file("garbage.kvlab"), SessionErrorKind::NOT_A_SESSION, "not an SQLite database");

    // An empty file is what a creator killed mid-way used to leave: a reader rejects it, a
    // read-write open replaces it with a fresh session (Reliability.AHalfCreatedFile...).
    test::write_file_bytes(dir.file("empty.kvlab"), "");
    expect_session_error([&] { SessionReader r(dir.file("empty.kvlab")); }, SessionErrorKind::NOT_A_SESSION, "it is empty");
    EXPECT_EQ(test::read_file_bytes(dir.file("empty.kvlab")), "");

    test::write_file_bytes(dir.file("text.kvlab"), "run,loss\n1,2.5\n");
    expect_rejected_untouched(dir.file("text.kvlab"), SessionErrorKind::NOT_A_SESSION, "not a kvlab session file");

    // A valid SQLite database of some other program.
    const std::string foreign = dir.file("foreign.db");
    {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t(a); INSERT INTO t VALUES(1);", nullptr, nullptr, nullptr),
                  SQLITE_OK);
        sqlite3_close(db);
    }
    expect_rejected_untouched(foreign, SessionErrorKind::NOT_A_SESSION, "another application");
}

TEST(SessionFile, TruncatedFileIsDamagedAndUntouched) {
    test::ScratchDir dir;
    const std::string path = dir.file("full.kvlab");
    test::make_session_with_spans(path, 20000);
    ASSERT_FALSE(std::filesystem::exists(path + "-wal") && std::filesystem::file_size(path + "-wal") > 0);
    const std::string full = test::read_file_bytes(path);
    ASSERT_GT(full.size(), 200000u);

    const std::string half = dir.file("half.kvlab");
    test::write_file_bytes(half, full.substr(0, full.size() / 2));
    expect_rejected_untouched(half, SessionErrorKind::DAMAGED, "is truncated");

    // Cut inside the 100-byte header: not even recognisable as SQLite any more.
    const std::string stub = dir.file("stub.kvlab");
    test::write_file_bytes(stub, full.substr(0, 50));
    const std::string before = test::read_file_bytes(stub);
    for (auto open :
         {+[](const std::string& p) { Session::open(p); }, +[](const std::string& p) { SessionReader r(p); }}) {
        try {
            open(stub);
            ADD_FAILURE() << "a 50-byte stub opened";
        } catch (const SessionError& e) {
            EXPECT_TRUE(e.kind() == SessionErrorKind::NOT_A_SESSION || e.kind() == SessionErrorKind::DAMAGED)
                << e.what();
        }
    }
    EXPECT_EQ(test::read_file_bytes(stub), before);
}

TEST(SessionFile, NewerSchemaIsANamedErrorNotAMisread) {
    test::ScratchDir dir;
    const std::string path = dir.file("future.kvlab");
    test::make_session_with_spans(path, 10);
    {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=99; UPDATE meta SET value='99' WHERE key='schema_version';",
                               nullptr, nullptr, nullptr),
                  SQLITE_OK);
        ASSERT_EQ(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE);", nullptr, nullptr, nullptr), SQLITE_OK);
        sqlite3_close(db);
    }
    expect_rejected_untouched(path, SessionErrorKind::NEWER_SCHEMA, "newer kvlab (schema version 99)");
    expect_session_error([&] { Session::open(path); }, SessionErrorKind::NEWER_SCHEMA,
                         "reads schema versions up to " + std::to_string(storage::kSchemaVersion));
}

TEST(SessionFile, MigrationsRunForwardInOneTransaction) {
    test::ScratchDir dir;
    const std::string path = dir.file("m.kvlab");
    Session::create(path);
    storage::Db db(path, SQLITE_OPEN_READWRITE);
    const int v = storage::kSchemaVersion;
    // A missing step fails and leaves the file at its version.
    std::vector<storage::Migration> gap = {{v, "ALTER TABLE runs ADD COLUMN extra TEXT", {}}};
    expect_session_error([&] { storage::schema_migrate(db, v + 2, gap); }, SessionErrorKind::INVALID,
                         "no migration from");
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "test"), v);
    EXPECT_EQ(db.query_int("SELECT count(*) FROM pragma_table_info('runs') WHERE name='extra'", 0, "test"), 0);
    // A complete chain runs and records the version in both places.
    std::vector<storage::Migration> chain = {{v, "ALTER TABLE runs ADD COLUMN extra TEXT", {}},
                                             {v + 1, "CREATE TABLE annotations(run_id INTEGER, text TEXT)", {}}};
    storage::schema_migrate(db, v + 2, chain);
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "test"), v + 2);
    EXPECT_EQ(db.query_text("SELECT value FROM meta WHERE key='schema_version'", "", "test"), std::to_string(v + 2));
    EXPECT_TRUE(db.table_exists("annotations"));
    // This build now refuses the file as newer than itself.
    expect_session_error([&] { storage::schema_validate(db); }, SessionErrorKind::NEWER_SCHEMA, "newer kvlab");
}

// Runs `fn` in a child process that cannot write to `dir` (as user nobody when we are root,
// since root ignores permission bits). Returns the child's report (one line per check).
std::string run_without_write_permission(const std::function<std::string()>& fn) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        std::string report;
        if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) report = "cannot drop privileges\n";
        try {
            report += fn();
        } catch (const std::exception& e) {
            report += std::string("unexpected exception: ") + e.what() + "\n";
        }
        ssize_t n = write(fds[1], report.data(), report.size());
        (void)n;
        _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out += "child crashed\n";
    return out;
}

TEST(SessionFile, ReadOnlyDirectoryGivesClearErrorsAndStillReads) {
    test::ScratchDir dir;
    const std::string path = dir.file("ro.kvlab");
    test::make_session_with_spans(path, 100);
    const std::string before = test::read_file_bytes(path);
    chmod(path.c_str(), 0644);
    chmod(dir.path().c_str(), 0555);
    std::string report = run_without_write_permission([&] {
        std::string r;
        auto check = [&](const char* what, const std::function<void()>& f, SessionErrorKind kind, const char* needle) {
            try {
                f();
                r += str(what, ": opened (expected an error)\n");
            } catch (const SessionError& e) {
                bool ok = e.kind() == kind && std::string(e.what()).find(needle) != std::string::npos;
                r += str(what, ok ? ": ok: " : ": WRONG ERROR: ", e.what(), "\n");
            }
        };
        check(
            "open read-write", [&] { Session::open(path); }, SessionErrorKind::NOT_WRITABLE, "not writable");
        check(
            "create", [&] { Session::create(dir.file("new.kvlab")); }, SessionErrorKind::NOT_WRITABLE, "not writable");
        try {
            SessionReader reader(path);
            auto runs = reader.runs();
            r += str("read-only reader: ",
                     runs.size() == 1 && reader.count_rows("spans", runs[0].id) == 100 ? "ok" : "WRONG DATA", "\n");
        } catch (const std::exception& e) {
            r += str("read-only reader: FAILED: ", e.what(), "\n");
        }
        return r;
    });
    chmod(dir.path().c_str(), 0755);
    std::printf("%s", report.c_str());
    EXPECT_NE(report.find("open read-write: ok"), std::string::npos) << report;
    EXPECT_NE(report.find("create: ok"), std::string::npos) << report;
    EXPECT_NE(report.find("read-only reader: ok"), std::string::npos) << report;
    EXPECT_EQ(report.find("crashed"), std::string::npos) << report;
    EXPECT_EQ(test::read_file_bytes(path), before);
    EXPECT_FALSE(std::filesystem::exists(dir.file("new.kvlab")));
}

// Notes and deletion (the GUI's run management): notes survive a reopen; deleting a run removes
// its rows from every run_id table and its notes, and nothing of any other run.
TEST(SessionFile, RunNotesAndDeletionTouchOnlyTheirRun) {
    test::ScratchDir dir;
    const std::string path = dir.file("notes.kvlab");
    int64_t keep = 0, drop = 0, live = 0;
    {
        auto s = Session::create(path);
        keep = s->create_run("keep");
        drop = s->create_run("drop");
        live = s->create_run("live");
        for (int64_t r : {keep, drop}) {
            s->start_run(r);
            s->finish_run(r, RunStatus::DONE);
        }
        s->set_run_notes(keep, "baseline; rerun after the fix");
        s->set_run_notes(drop, "to go");
        expect_session_error([&] { s->set_run_notes(999, "x"); }, SessionErrorKind::INVALID, "has no run 999");
    }
    {
        storage::Db db(path, SQLITE_OPEN_READWRITE);
        for (int64_t r : {keep, drop, keep})
            db.exec(str("INSERT INTO logs(run_id) VALUES(", r, "); INSERT INTO metrics(run_id) VALUES(", r, ");"), "test");
    }
    auto count = [&](const std::string& sql) {
        storage::Db db(path, SQLITE_OPEN_READONLY);
        return db.query_int(sql, -1, "test");
    };
    auto s = Session::open(path);
    EXPECT_EQ(s->run_notes().at(keep), "baseline; rerun after the fix");
    EXPECT_EQ(storage::read_run_notes(path).at(drop), "to go");
    // A live run (queued by this process) cannot be deleted; an unknown one is named.
    expect_session_error([&] { s->delete_run(live); }, SessionErrorKind::INVALID, "is queued; cancel it");
    expect_session_error([&] { s->delete_run(4242); }, SessionErrorKind::INVALID, "has no run 4242");
    s->delete_run(drop);
    const auto left = s->runs();
    ASSERT_EQ(left.size(), 2u);
    EXPECT_EQ(left[0].id, keep);
    EXPECT_EQ(left[1].id, live);
    EXPECT_EQ(count(str("SELECT count(*) FROM logs WHERE run_id=", drop)), 0);
    EXPECT_EQ(count(str("SELECT count(*) FROM metrics WHERE run_id=", drop)), 0);
    EXPECT_EQ(count(str("SELECT count(*) FROM logs WHERE run_id=", keep)), 2);
    EXPECT_EQ(count(str("SELECT count(*) FROM metrics WHERE run_id=", keep)), 2);
    const auto notes = s->run_notes();
    EXPECT_EQ(notes.count(drop), 0u);
    EXPECT_EQ(notes.at(keep), "baseline; rerun after the fix");
    s->set_run_notes(keep, "");  // "" removes them
    EXPECT_TRUE(s->run_notes().empty());
    EXPECT_EQ(s->integrity_check(), "ok");
}

// A version-4 file (before notes) opens read-write, migrates to notes, and keeps its runs; read
// only, it is refused as every older file is (nothing written to it).
TEST(SessionFile, Version4FilesGainNotesKeepingTheirRuns) {
    test::ScratchDir dir;
    const std::string path = dir.file("v4.kvlab");
    {
        auto s = Session::create(path);
        const int64_t r = s->create_run("old run", R"({"mode":"eval_long"})");
        s->start_run(r);
        s->finish_run(r, RunStatus::DONE);
    }
    {
        storage::Db db(path, SQLITE_OPEN_READWRITE);
        db.exec("DROP TABLE run_notes; PRAGMA user_version=4; UPDATE meta SET value='4' WHERE key='schema_version';", "test");
    }
    expect_session_error([&] { storage::read_run_notes(path); }, SessionErrorKind::INVALID, "must upgrade it first");
    auto s = Session::open(path);
    ASSERT_EQ(s->runs().size(), 1u);
    EXPECT_EQ(s->runs()[0].name, "old run");
    s->set_run_notes(s->runs()[0].id, "kept");
    EXPECT_EQ(storage::read_run_notes(path).at(s->runs()[0].id), "kept");
    storage::Db db(path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "test"), storage::kSchemaVersion);
}

// Two connections (two processes opening one old file at once) both see the old version; the
// first takes the write lock and migrates, the second waits for the lock. It must find the file
// migrated then, not run the (non-idempotent) step again and fail.
TEST(SessionFile, AMigrationWaitingForTheLockFindsItDone) {
    test::ScratchDir dir;
    const std::string path = dir.file("race.kvlab");
    Session::create(path);
    const int v = storage::kSchemaVersion;
    std::atomic<int> steps{0};
    std::atomic<bool> in_step{false};
    const std::vector<storage::Migration> chain = {
        {v, "CREATE TABLE annotations(run_id INTEGER, text TEXT)", [&](storage::Db&) {
             ++steps;
             in_step = true;
             std::this_thread::sleep_for(std::chrono::milliseconds(300));  // hold the lock
         }}};
    storage::Db a(path, SQLITE_OPEN_READWRITE), b(path, SQLITE_OPEN_READWRITE);
    sqlite3_busy_timeout(a.handle(), 5000);
    sqlite3_busy_timeout(b.handle(), 5000);
    std::string error;
    std::thread first([&] { storage::schema_migrate(a, v + 1, chain); });
    while (!in_step) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    try {
        storage::schema_migrate(b, v + 1, chain);  // read v before the lock, then waits for it
    } catch (const std::exception& e) {
        error = e.what();
    }
    first.join();
    EXPECT_EQ(error, "");
    EXPECT_EQ(steps.load(), 1) << "the step ran once";
    EXPECT_EQ(b.query_int("PRAGMA user_version", 0, "test"), v + 1);
}

}  // namespace
}  // namespace kv
