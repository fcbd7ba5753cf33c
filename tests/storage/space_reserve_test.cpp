// The space reserve (issue 17, storage/space_reserve.h): when telemetry fills the disk, the
// run's end record — a summary of tens of KiB and its final status — still fits. The disk is a
// file-size limit (RLIMIT_FSIZE) in a forked child; small writer batches make the failing batch
// small, so without the reserve the end record finds no room.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "engine/telemetry/trace.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage/space_reserve.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::RunStatus;
using storage::Session;

// A summary as large as a long run's (per-phase memory, event counts): 48 KiB of JSON.
std::string big_summary() { return std::string(R"({"pad":")") + std::string(48 * 1024, 'x') + "\"}"; }

// Child: records metrics under a file-size limit (the file's size + `room`, or `room` alone when
// `absolute`) until the writer reports a fault, then writes
// the run's end (summary, degraded). Exit: 0 end recorded, 4 never told, 5 summary failed,
// 6 status failed, 3 anything else. The writer's error goes to `err_fd`.
[[noreturn]] void child(const std::string& path, int64_t room, bool absolute, int err_fd) {
    try {
        signal(SIGXFSZ, SIG_IGN);
        auto session = Session::open(path);
        const int64_t run = session->create_run("full disk", R"({"mode":"eval_long"})");
        session->start_run(run);
        std::atomic<bool> told{false};
        std::string error;
        storage::WriterOptions wo;
        wo.batch_rows = 64;  // a failing batch of one or two WAL frames
        wo.on_fault = [&](int64_t id, uint64_t, const std::string& e) {
            if (id == run && !told.exchange(true)) error = e;
        };
        storage::SessionWriter writer(path, wo);
        trace::Recorder rec;
        writer.attach(run, rec);
        struct stat st {};
        ::stat(path.c_str(), &st);
        struct rlimit rl {};
        rl.rlim_cur = rl.rlim_max = rlim_t(absolute ? room : st.st_size + room);
        setrlimit(RLIMIT_FSIZE, &rl);
        {
            trace::RecorderScope scope(rec);
            static const trace::Name kStep("step");
            for (int64_t step = 0; step < 4000000 && !told.load(); ++step) {
                trace::metric(kStep, step, double(step));
                while (rec.stats().pending > 2000 && !told.load()) std::this_thread::yield();
            }
        }
        writer.detach(run);
        ssize_t n = write(err_fd, error.data(), error.size());
        (void)n;
        if (!told.load()) _exit(4);
        try {
            session->merge_summary(run, big_summary());
        } catch (const std::exception& e) {
            std::fprintf(stderr, "[child] summary: %s\n", e.what());
            _exit(5);
        }
        try {
            session->finish_run(run, RunStatus::DEGRADED, "disk full: telemetry events lost");
        } catch (const std::exception& e) {
            std::fprintf(stderr, "[child] status: %s\n", e.what());
            _exit(6);
        }
        _exit(0);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "[child] failed: %s\n", e.what());
    }
    _exit(3);
}

int run_child(const std::string& path, int64_t room, bool absolute, std::string* error) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(p[0]);
        child(path, room, absolute, p[1]);
    }
    close(p[1]);
    char buf[4096];
    ssize_t n = 0;
    while ((n = read(p[0], buf, sizeof buf)) > 0) error->append(buf, size_t(n));
    close(p[0]);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

TEST(SpaceReserve, TheEndRecordFitsWhenTelemetryFilledTheFileSizeLimit) {
    for (int64_t room : {int64_t(2) << 20, int64_t(700) << 10}) {
        SCOPED_TRACE(room);
        test::ScratchDir dir;
        const std::string path = dir.file("full.kvlab");
        Session::create(path).reset();
        std::string error;
        const int rc = run_child(path, room, false, &error);
        ASSERT_NE(rc, 4) << "the writer never reported a fault";
        ASSERT_EQ(rc, 0) << "the run's end record did not fit (5: summary, 6: status); writer error: " << error;
        EXPECT_NE(error.find("disk is full"), std::string::npos) << error;
        EXPECT_NE(error.find("kept for the run's end record"), std::string::npos) << error;
        storage::SessionReader reader(path);
        const auto r = reader.run(1);
        EXPECT_EQ(r.status, RunStatus::DEGRADED);
        EXPECT_NE(r.summary.find(std::string(48 * 1024, 'x')), std::string::npos);
        EXPECT_EQ(Session::open(path)->integrity_check(), "ok");
    }
}

// A limit below the reserve: the writer's WAL may not hold one batch, yet the end is recorded.
TEST(SpaceReserve, LessRoomThanTheReserveStopsTelemetryAtOnce) {
    test::ScratchDir dir;
    const std::string path = dir.file("full.kvlab");
    Session::create(path).reset();
    std::string error;
    ASSERT_EQ(run_child(path, storage::kTelemetryReserveBytes - 1, true, &error), 0) << error;
    EXPECT_NE(error.find("kept for the run's end record"), std::string::npos) << error;
    storage::SessionReader reader(path);
    EXPECT_EQ(reader.run(1).status, RunStatus::DEGRADED);
}

}  // namespace
}  // namespace kv
