// Runs in a session: each submitted configuration becomes a run row (queued), executes on a
// worker thread of the embedded engine with its own memory tracker and telemetry recorder,
// reports progress and output, can be cancelled at any point (it stops within one chunk), and
// ends done / failed / cancelled with a JSON summary. Opening a session marks runs left
// running by a dead process as crashed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/run/run_config.h"
#include "storage/run_info.h"

namespace kv::storage {
class Session;
class SessionWriter;
}  // namespace kv::storage

namespace kv::sessions {

struct RunEvents {
    // All called from the worker thread; keep them quick (the GUI posts to its own thread).
    std::function<void(int64_t run, storage::RunStatus status, const std::string& message)> status;
    std::function<void(int64_t run, int64_t done, int64_t total, const std::string& what)> progress;
    std::function<void(int64_t run, const std::string& text)> output;
};

class RunManager {
   public:
    // Opens (or creates) the session file. Throws storage::SessionError with a clear message.
    explicit RunManager(const std::string& session_path, RunEvents events = {});
    ~RunManager();  // cancels running work and waits for the worker
    RunManager(const RunManager&) = delete;
    RunManager& operator=(const RunManager&) = delete;

    const std::string& path() const { return path_; }
    // Runs this process found crashed when it opened the session.
    const std::vector<int64_t>& crashed_at_open() const;

    // Validates (throws kv::Error with the CLI's message), records the run as queued, returns its id.
    int64_t submit(const RunConfig& cfg);
    // Queued runs are cancelled at once; a running one stops within one chunk.
    void cancel(int64_t run);
    void cancel_all();
    // Blocks until the run reaches a final status; returns it.
    storage::RunStatus wait(int64_t run);
    void wait_all();
    storage::RunStatus status(int64_t run);
    // The run's summary JSON / result text / error after it finished.
    std::string summary(int64_t run);
    std::string result_text(int64_t run);
    // Why the run failed, was cancelled or degraded ("" otherwise), as this process knows it
    // (also when the session file could not record it, e.g. on a full disk).
    std::string message(int64_t run);

    storage::Session& session() { return *session_; }

   private:
    struct Job {
        int64_t run;
        RunConfig cfg;
        std::shared_ptr<std::atomic<bool>> cancel;
    };
    void worker_main();
    void execute(Job& job);
    void set_status(int64_t run, storage::RunStatus s, const std::string& message);
    void on_write_fault(int64_t run, uint64_t lost, const std::string& error);
    void fail_unexpectedly(int64_t run, const std::string& why);

    struct WriteFault {
        uint64_t lost = 0;
        std::string error;
        bool stopped = false;  // the run was cancelled because of it (--telemetry.on_error stop)
    };

    std::string path_;
    RunEvents events_;
    std::unique_ptr<storage::Session> session_;
    std::unique_ptr<storage::SessionWriter> writer_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> queue_;
    std::map<int64_t, std::shared_ptr<std::atomic<bool>>> cancel_flags_;
    std::map<int64_t, storage::RunStatus> status_;
    std::map<int64_t, std::string> text_;
    std::map<int64_t, std::string> messages_;
    std::map<int64_t, WriteFault> faults_;
    std::map<int64_t, bool> stop_on_fault_;
    bool stopping_ = false;
    std::thread worker_;
};

// Where a run goes when no --session is given: ~/.local/share/kvlab/session-<time>.kvlab
// (or the working directory when that cannot be created).
std::string default_session_path();

}  // namespace kv::sessions
