// The space reserve (issue 17): a run's end record (its summary and final status, e.g.
// `degraded` with "720 telemetry events lost") must fit even when the run's telemetry filled
// the disk. Telemetry is written on its own connection (SessionWriter), opened through a small
// SQLite VFS shim that refuses, with SQLITE_FULL, any write that would leave less than the
// reserve free — on the file system (statvfs) or under the process's file-size limit
// (RLIMIT_FSIZE, which caps each file separately, so it is checked per file). The run's own
// connection (Session) writes through the plain VFS, so it finds that space.
//
// What is kept free is set per thread (the writer thread), so the same connection can let its
// own final summary use part of the reserve while its telemetry batches may not. Another
// process filling the same disk can still take the space; nothing short of a preallocated
// file could stop that, and a file-size limit would not honour one.
#pragma once

#include <cstdint>

namespace kv::storage {

// A session's WAL frame is a 16 KiB page plus a 24-byte header. The run's end is two small
// transactions on the run's row (summary merge, final status): a few frames each, more when the
// row's b-tree page splits. Sixteen frames cover that with room to spare.
constexpr int64_t kWalFrameBytes = 16384 + 24;
constexpr int64_t kEndRecordReserveBytes = 16 * kWalFrameBytes;
// Telemetry batches leave room for the writer's own final summary and progress of each run
// (another sixteen frames) on top of the end record.
constexpr int64_t kTelemetryReserveBytes = 32 * kWalFrameBytes;

// Name of the reserve VFS (registered on first use); pass it to sqlite3_open_v2.
const char* reserve_vfs_name();

// While alive, writes on this thread through the reserve VFS keep `bytes` free (0: no check).
class KeepFree {
   public:
    explicit KeepFree(int64_t bytes);
    ~KeepFree();
    KeepFree(const KeepFree&) = delete;
    KeepFree& operator=(const KeepFree&) = delete;

   private:
    int64_t saved_;
};

// True when the reserve refused a write on this thread since the last call (then cleared).
bool take_reserve_refusal();

}  // namespace kv::storage
