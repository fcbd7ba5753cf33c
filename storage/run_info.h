// What a session knows about one run: status, times, progress, owner, config and summary JSON
// as stored in the runs table. Value types only; reading and writing live in session.h and
// session_reader.h.
#pragma once

#include <cstdint>
#include <string>

namespace kv::storage {

// DEGRADED: the run finished, but telemetry was lost on the way (disk full, writer error); its
// numbers stand, its recorded events are incomplete (RunInfo::error says how many were lost).
enum class RunStatus : uint8_t { QUEUED = 0, RUNNING, DONE, FAILED, CANCELLED, CRASHED, DEGRADED, COUNT };
constexpr size_t kNumRunStatuses = size_t(RunStatus::COUNT);
// "queued", "running", "done", "failed", "cancelled", "crashed", "degraded" (stored in the runs table).
const char* run_status_name(RunStatus s);
// Inverse of run_status_name; throws SessionError (INVALID) listing the valid names.
RunStatus run_status_from_name(const std::string& name);
// done, failed, cancelled, crashed, degraded: the run will not change any more.
inline bool run_status_final(RunStatus s) { return s != RunStatus::QUEUED && s != RunStatus::RUNNING; }

struct RunProgress {
    int64_t tokens_done = 0, tokens_total = 0;
    int32_t chunks_done = 0, chunks_total = 0;
    int32_t steps_done = 0, steps_total = 0;
    int64_t updated_ms = 0;  // wall clock of the last update (0 = never)
};

struct RunInfo {
    int64_t id = 0;
    std::string name;
    std::string config;  // JSON
    RunStatus status = RunStatus::QUEUED;
    int64_t created_ms = 0, started_ms = 0, finished_ms = 0;  // wall clock, 0 = not yet
    int64_t t0_ns = 0;  // engine clock when the run started (event times are relative to it)
    RunProgress progress;
    std::string host;   // JSON: hostname, os, cpus, pid
    std::string build;  // JSON supplied by the caller (version, backends, ...)
    std::string error;  // why it failed / crashed ("" otherwise)
    int64_t owner_pid = 0;
    std::string owner_host;
    std::string summary;  // JSON: events and dropped events per type, peaks, throughput
    // For running runs seen by a reader: whether the owning process still lives (true when it
    // cannot be told, e.g. another host).
    bool owner_alive = true;
};

// The status as a person should read it: run_status_name, plus " (owner gone)" for a queued or
// running run whose process is dead (a reader cannot mark it crashed; the next writer will).
std::string run_status_label(const RunInfo& r);

}  // namespace kv::storage
