// A run whose writer process died reads as "running (owner gone)" in a comparison (issue 17),
// not as a live "running": a read-only reader cannot mark it crashed, but must not pretend it
// is still going. A run of a live process still reads "running".
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage/comparison.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::RunStatus;
using storage::Session;

TEST(OwnerGone, CompareShowsARunWhoseWriterDiedAsOwnerGone) {
    test::ScratchDir dir;
    const std::string path = dir.file("gone.kvlab");
    auto s = Session::create(path);
    const int64_t done = s->create_run("done");
    s->start_run(done);
    s->finish_run(done, RunStatus::DONE);
    // A child process starts run 2 and dies without finishing it.
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        try {
            auto c = Session::open(path);
            c->start_run(c->create_run("orphan"));
            _exit(0);
        } catch (...) {
        }
        _exit(3);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    // Run 3: started by this (live) process.
    const int64_t live = s->create_run("live");
    s->start_run(live);

    storage::SessionReader reader(path);
    const storage::Comparison c = storage::compare_runs(reader, {done, 2, live}, done);
    ASSERT_EQ(c.runs.size(), 3u);
    EXPECT_EQ(c.runs[0].status, "done");
    EXPECT_EQ(c.runs[1].status, "running (owner gone)");
    EXPECT_EQ(c.runs[2].status, "running");
    const std::string table = storage::format_comparison(c);
    EXPECT_NE(table.find("\n2     running (owner gone) "), std::string::npos) << table;
    EXPECT_NE(table.find("\n3     running              "), std::string::npos) << table;
}

}  // namespace
}  // namespace kv
