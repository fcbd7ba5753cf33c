// The single writer of a session's events: one thread with its own connection drains every
// attached Recorder's queues into batched transactions (prepared statements, ~10k rows or
// 50 ms per commit, whichever first). Producers never touch SQLite and never wait for it; the
// writer never waits for readers (WAL). Several runs of one process share one writer.
// Must not be used for run lifecycle (Session does that); must not block in attach/flush
// longer than one drain-and-commit.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/telemetry/recorder.h"

namespace kv::storage {

struct WriterOptions {
    size_t batch_rows = 10000;       // commit after this many rows ...
    int commit_interval_ms = 50;     // ... or this long after the first uncommitted row (GUI sees >= 20 Hz)
    int idle_sleep_ms = 2;           // poll period while the queues are empty
    int summary_interval_ms = 1000;  // rewrite each run's summary this often (kept if the run dies)
    // Called on the writer thread right after a batch holding a run's events failed to commit
    // (disk full, I/O error): the run's total lost events so far and the error. Keep it quick;
    // it must not call back into the writer.
    std::function<void(int64_t run_id, uint64_t lost, const std::string& error)> on_fault;
};

struct WriterRunStats {
    int64_t run_id = 0;
    std::array<uint64_t, trace::kNumEventTypes> written{};  // events stored, per type
    uint64_t rows = 0;                                      // rows inserted (GPU batches expand to many rows)
    uint64_t lost = 0;                                      // events drained but lost to a failed transaction
    trace::RecorderStats recorder;                          // pushed / dropped by the producers
    std::string error;                                      // last writer error ("" = none)
};

struct WriterStats {
    uint64_t rows = 0;
    uint64_t events = 0;
    uint64_t commits = 0;
    uint64_t failed_commits = 0;
    double busy_seconds = 0;  // wall time spent draining and writing
    double cpu_seconds = 0;   // CPU time of the writer thread (what a dedicated core would need)
    std::string error;
};

class SessionWriter {
   public:
    // Opens its own read-write connection to an existing session and starts the thread.
    explicit SessionWriter(const std::string& path, const WriterOptions& options = {});
    // Drains and commits everything still queued, writes summaries, stops the thread.
    ~SessionWriter();
    SessionWriter(const SessionWriter&) = delete;
    SessionWriter& operator=(const SessionWriter&) = delete;

    // Starts writing `recorder`'s events as rows of run `run_id`. The recorder must outlive
    // detach(). A run can be attached once at a time.
    void attach(int64_t run_id, trace::Recorder& recorder);
    // Drains the run's recorder completely (its producers should have finished), commits,
    // writes the final summary into runs.summary and forgets the recorder.
    WriterRunStats detach(int64_t run_id);
    // Returns once everything queued before the call is committed (visible to readers).
    void flush();

    WriterStats stats() const;
    const std::string& path() const { return path_; }

   private:
    struct Impl;
    void thread_main();

    std::string path_;
    WriterOptions options_;
    std::unique_ptr<Impl> impl_;

    // Control block shared with the writer thread.
    mutable std::mutex mu_;
    std::condition_variable cv_;       // wakes the writer
    std::condition_variable done_cv_;  // wakes callers waiting for flush/detach
    struct Request {
        enum Kind { ATTACH, DETACH, FLUSH } kind;
        int64_t run_id = 0;
        trace::Recorder* recorder = nullptr;
        uint64_t seq = 0;
    };
    std::vector<Request> requests_;
    uint64_t next_seq_ = 1;
    uint64_t done_seq_ = 0;  // highest request seq completed, in order
    std::vector<std::pair<uint64_t, WriterRunStats>> detach_results_;
    std::vector<std::pair<uint64_t, std::string>> request_errors_;
    bool stop_ = false;
    WriterStats stats_;
    std::thread thread_;
};

}  // namespace kv::storage
