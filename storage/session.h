// A session file opened for writing run lifecycle: create runs, start/finish them, progress and
// summaries. Opening marks runs left `running` by a dead process as `crashed` (liveness.h).
// Events are not written here but by SessionWriter on its own connection and thread; readers
// use SessionReader. Thread-safe (one connection behind a mutex); never blocks event producers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/rows.h"
#include "storage/run_info.h"
#include "storage/session_file.h"

namespace kv::storage {

class Session {
   public:
    // New session file at `path`; fails if anything exists there. Built under a temporary name
    // and linked into place, so no other process ever sees a half-made session.
    static std::unique_ptr<Session> create(const std::string& path);
    // Existing session, read-write: validated, migrated if older, dead runs marked crashed.
    static std::unique_ptr<Session> open(const std::string& path);
    // Creates the session, or opens it when it exists (also when another process created it a
    // moment ago). An empty or table-less file left by a creator killed mid-way (older kvlab)
    // is recognised and replaced by a fresh session.
    static std::unique_ptr<Session> open_or_create(const std::string& path);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    const std::string& path() const { return path_; }
    // Runs this open found `running` with a dead owner and marked `crashed`.
    const std::vector<int64_t>& crashed_at_open() const { return crashed_at_open_; }

    // ---- run lifecycle ------------------------------------------------------------------
    // A queued run with its full configuration (JSON text; validated as JSON).
    int64_t create_run(const std::string& name, const std::string& config_json = "{}");
    // queued -> running: records start time, engine clock origin (t0_ns), this process as owner,
    // host info and the caller's build info JSON. Returns t0_ns.
    uint64_t start_run(int64_t run, const std::string& build_json = "{}");
    // running (or queued) -> done / failed / cancelled; `error` says why for failed/cancelled.
    void finish_run(int64_t run, RunStatus status, const std::string& error = "");
    void set_progress(int64_t run, const RunProgress& progress);
    // Merges a JSON object into the run's summary (RFC 7396 merge patch).
    void merge_summary(int64_t run, const std::string& json_patch);
    void rename_run(int64_t run, const std::string& name);
    // A person's notes on a run (any status); "" removes them. Throws SessionError (INVALID)
    // for an unknown run.
    void set_run_notes(int64_t run, const std::string& notes);
    // Deletes a finished run with everything recorded for it (its rows in every table that has
    // a run_id, its notes, its rank runs), in one transaction; other runs' rows are untouched.
    // Throws SessionError (INVALID) for an unknown run, a rank run, or one still queued/running.
    void delete_run(int64_t run);
    // One evaluated sample's token ids, pieces and per-position loss (storage/sample_tokens.h):
    // one INSERT in its own transaction. Throws SessionError (full disk, bad lengths).
    void write_sample_tokens(int64_t run, const SampleTokensRow& row);

    // ---- queries ------------------------------------------------------------------------
    RunInfo run(int64_t id);  // throws SessionError (INVALID) for an unknown id
    std::vector<RunInfo> runs();
    // Every run's notes, by run id (runs without notes are absent).
    std::map<int64_t, std::string> run_notes();
    // Marks unfinished runs (queued or running) whose owner process is gone as `crashed`, with
    // the state they were in; returns their ids.
    std::vector<int64_t> recover_crashed_runs();

    // ---- maintenance --------------------------------------------------------------------
    // "ok" or SQLite's list of problems (PRAGMA integrity_check).
    std::string integrity_check();
    // Folds the WAL back into the file (PRAGMA wal_checkpoint(TRUNCATE)); false when readers or
    // a writer kept it from completing (nothing is lost either way).
    bool checkpoint();

   private:
    Session(std::unique_ptr<Db> db, std::string path);
    RunInfo run_locked(int64_t id);

    std::mutex mu_;
    std::unique_ptr<Db> db_;
    std::string path_;
    std::vector<int64_t> crashed_at_open_;
};

// The notes of every run of the session at `path`, read through a read-only connection. Throws
// SessionError as SessionReader does (an older file must be opened read-write once first).
std::map<int64_t, std::string> read_run_notes(const std::string& path);

// SELECT list and row decoding shared with SessionReader.
extern const std::string kRunColumns;
RunInfo run_from_row(const Stmt& s);

}  // namespace kv::storage
