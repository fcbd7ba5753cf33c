// A run process killed with SIGKILL in the middle of writing: the session reopens, passes
// PRAGMA integrity_check, holds every batch the child saw committed (as a gap-free prefix),
// marks the run crashed, and takes new runs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "engine/telemetry/trace.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::RunStatus;
using storage::Session;

// Child: writes metric steps 0, 1, 2, ... forever, and after every flush() reports on the pipe
// how many steps are committed. Never returns.
[[noreturn]] void child_writer(const std::string& path, int run_id_fd, int committed_fd) {
    try {
        auto session = Session::open(path);
        int64_t run = session->create_run("doomed", R"({"mode":"eval_long"})");
        session->start_run(run);
        ssize_t n = write(run_id_fd, &run, sizeof run);
        (void)n;
        trace::Recorder rec;
        storage::SessionWriter writer(path);
        writer.attach(run, rec);
        trace::RecorderScope scope(rec);
        static const trace::Name kLoss("step"), kSpan("chunk");
        for (int64_t step = 0;; ++step) {
            trace::SpanScope s(trace::SpanCategory::CHUNK, kSpan, {.chunk = int32_t(step)});
            trace::metric(kLoss, step, double(step));
            if (step % 5000 == 4999) {
                writer.flush();
                int64_t committed = step + 1;
                n = write(committed_fd, &committed, sizeof committed);
                (void)n;
            }
            while (rec.stats().pending > 30000) std::this_thread::yield();
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "child failed: %s\n", e.what());
    }
    _exit(3);
}

TEST(CrashRecovery, SigkillMidRunKeepsCommittedBatchesAndMarksTheRunCrashed) {
    test::ScratchDir dir;
    const std::string path = dir.file("crash.kvlab");
    int64_t earlier = 0;
    {
        auto s = Session::create(path);
        earlier = s->create_run("finished earlier");
        s->start_run(earlier);
        s->finish_run(earlier, RunStatus::DONE);
    }
    int run_pipe[2], commit_pipe[2];
    ASSERT_EQ(pipe(run_pipe), 0);
    ASSERT_EQ(pipe(commit_pipe), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(run_pipe[0]);
        close(commit_pipe[0]);
        child_writer(path, run_pipe[1], commit_pipe[1]);
    }
    close(run_pipe[1]);
    close(commit_pipe[1]);
    int64_t run = 0;
    ASSERT_EQ(read(run_pipe[0], &run, sizeof run), ssize_t(sizeof run));
    // Let it commit a few batches, then kill it while it keeps writing.
    int64_t committed = 0;
    while (committed < 40000) {
        int64_t c = 0;
        ssize_t n = read(commit_pipe[0], &c, sizeof c);
        ASSERT_EQ(n, ssize_t(sizeof c)) << "the child stopped reporting";
        committed = c;
    }
    // A reader in this process while the child writes: sees a consistent prefix.
    {
        storage::SessionReader r(path);
        EXPECT_EQ(r.run(run).status, RunStatus::RUNNING);
        EXPECT_TRUE(r.run(run).owner_alive);
        EXPECT_GE(r.count_rows("metrics", run), committed);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
    // The last report may be newer than what we read; drain the pipe.
    int64_t c = 0;
    while (read(commit_pipe[0], &c, sizeof c) == ssize_t(sizeof c)) committed = std::max(committed, c);
    close(commit_pipe[0]);
    close(run_pipe[0]);

    auto s = Session::open(path);
    EXPECT_EQ(s->integrity_check(), "ok");
    ASSERT_EQ(s->crashed_at_open(), std::vector<int64_t>{run});
    storage::RunInfo info = s->run(run);
    EXPECT_EQ(info.status, RunStatus::CRASHED);
    EXPECT_NE(info.error.find("ended without finishing"), std::string::npos) << info.error;
    EXPECT_GT(info.finished_ms, 0);
    EXPECT_EQ(s->run(earlier).status, RunStatus::DONE);
    {
        storage::SessionReader r(path);
        auto m = r.metrics(run, "step");
        ASSERT_GE(int64_t(m.size()), committed) << "a committed batch is missing";
        for (size_t i = 0; i < m.size(); ++i)
            if (m[i].step != int64_t(i)) {
                ADD_FAILURE() << "hole in committed data at row " << i << " (step " << m[i].step << ")";
                break;
            }
        // The span of the step that called flush() was still open, so it is one behind.
        EXPECT_GE(r.count_rows("spans", run), committed - 1);
        std::printf("[ info ] child reported %lld steps committed; %zu found after SIGKILL\n", (long long)committed,
                    m.size());
    }
    // The session keeps working: a new run, and reopening does not re-mark anything.
    int64_t next = s->create_run("after the crash");
    s->start_run(next);
    s->finish_run(next, RunStatus::DONE);
    s.reset();
    auto again = Session::open(path);
    EXPECT_TRUE(again->crashed_at_open().empty());
    EXPECT_EQ(again->runs().size(), 3u);
    EXPECT_EQ(again->run(next).status, RunStatus::DONE);
}

}  // namespace
}  // namespace kv
