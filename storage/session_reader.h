// Read-only access to a session for the GUI, the CLI and exports: its own read-only connection
// (WAL: never blocks the writer, never waits for it), queries shaped for the views (a time
// window of one run, one layer's cache steps, the newest rows since the last refresh) and
// streaming iteration for exports. Each call sees one committed snapshot.
// Never writes, never marks runs crashed (Session does), never touches engine objects.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/rows.h"
#include "storage/run_info.h"
#include "storage/sqlite_util.h"

namespace kv::storage {

class SessionReader {
   public:
    // Opens an existing session read-only (validated like any open; see session_file.h).
    explicit SessionReader(const std::string& path);
    ~SessionReader();
    SessionReader(const SessionReader&) = delete;
    SessionReader& operator=(const SessionReader&) = delete;

    const std::string& path() const { return path_; }

    // ---- runs ---------------------------------------------------------------------------
    std::vector<RunInfo> runs();
    RunInfo run(int64_t id);  // throws SessionError (INVALID) for an unknown id

    // ---- memory -------------------------------------------------------------------------
    // Rows with id > after_id. With the default window: in id (commit) order, the cheap way to
    // follow a live run. With a window: rows with t in [t0, t1), in time order.
    std::vector<MemoryEventRow> memory_events(int64_t run, const TimeWindow& window = {}, int64_t after_id = 0,
                                              size_t limit = 1 << 20);
    // Every event of the run in the window, in time order, without materializing them.
    void for_each_memory_event(int64_t run, const TimeWindow& window,
                               const std::function<void(const MemoryEventRow&)>& fn);
    // Devices (trace::device_code) that have memory events in this run, ascending.
    std::vector<int> memory_devices(int64_t run);
    // The window split into `buckets` equal time buckets for one device: min/max/last device
    // total and the category split at the maximum. Cost is linear in the events in the window.
    std::vector<MemoryBucket> memory_timeline(int64_t run, int device, const TimeWindow& window, int buckets);

    // ---- spans --------------------------------------------------------------------------
    // Spans overlapping [t0, t1) (or, with the default window, all), with id > after_id,
    // ordered by start time; at most `limit`.
    std::vector<SpanRow> spans(int64_t run, const TimeWindow& window = {}, int64_t after_id = 0,
                               size_t limit = 1 << 20);
    void for_each_span(int64_t run, const std::function<void(const SpanRow&)>& fn);

    // ---- cache, scores, cells -----------------------------------------------------------
    // Cache steps of one layer (layer < 0: all layers), by chunk; id > after_id.
    std::vector<CacheStepRow> cache_steps(int64_t run, int layer, int64_t after_id = 0, size_t limit = 1 << 20);
    // Score snapshots of one layer (layer < 0: all), by chunk. `with_values` loads full arrays.
    std::vector<ScoreRow> score_snapshots(int64_t run, int layer, int64_t after_id = 0, bool with_values = true,
                                          size_t limit = 1 << 20);
    std::vector<CellRow> cells(int64_t run, int64_t after_id = 0);

    // ---- metrics, logs, GPU -------------------------------------------------------------
    // Metrics of one name ("" = all), by id; id > after_id.
    std::vector<MetricRow> metrics(int64_t run, const std::string& name = "", int64_t after_id = 0);
    std::vector<std::string> metric_names(int64_t run);
    std::vector<LogRow> logs(int64_t run, int64_t after_id = 0, size_t limit = 1 << 20);
    // Evaluated samples (token ids, pieces, per-position loss) with id > after_id, by id.
    std::vector<SampleTokensRow> sample_tokens(int64_t run, int64_t after_id = 0, bool with_pieces = true);
    // Kernels, memcpys and memsets of the run, by start time, with the launching span's id.
    std::vector<GpuActivityRow> gpu_activity(int64_t run);

    // Rows of `table` (one of the event tables) for the run.
    int64_t count_rows(const std::string& table, int64_t run);
    // Text of a StringIds id ("" if unknown).
    std::string string(int64_t id);

   private:
    // Rows of `run` in [t0, t1) (of `device`, or all when -2) with id > after_id, in block
    // order (not sorted), read through the block-range index; with first_n > 0, at least the
    // first_n of them in (t_ns, id) order (and possibly more). Caller holds mu_ and a snapshot.
    void memory_window_locked(int64_t run, const TimeWindow& w, int64_t after_id, int device,
                              const std::function<void(const Stmt&)>& row, size_t first_n = 0);
    // The window's rows (id > after_id) in (t_ns, id) order, at most `limit`, labels resolved
    // only for those returned. Caller holds mu_.
    std::vector<MemoryEventRow> sorted_memory_window_locked(int64_t run, const TimeWindow& w, int64_t after_id, size_t limit);
    // Id ranges of `run`'s memory blocks that may hold rows of [t0, t1) with id > after_id,
    // adjacent blocks merged; from the in-memory copy of the block table (caller holds a
    // snapshot, in which new blocks are read first).
    std::vector<std::pair<int64_t, int64_t>> memory_ranges_locked(int64_t run, const TimeWindow& w, int64_t after_id);
    // Index of the first block of `run` whose t_max >= t (blocks.size() if none).
    size_t first_memory_block_reaching_locked(int64_t run, int64_t t);
    struct BlockExtent {
        int64_t first_id, last_id, t_min, t_max;
    };
    // A run's memory blocks in id order, with the prefix maximum of t_max and the suffix minimum
    // of t_min: blocks are appended nearly in time order, so two binary searches cut any window
    // down to the few blocks that can overlap it (a query over the blocks table scans them all).
    struct MemoryBlockIndex {
        int64_t last_rowid = 0;
        std::vector<BlockExtent> blocks;
        std::vector<int64_t> prefix_max_t_max, suffix_min_t_min;
    };
    MemoryBlockIndex& memory_blocks_locked(int64_t run);
    const std::string& string_locked(int64_t id);
    MemoryEventRow memory_row(const Stmt& s, bool with_label = true);
    SpanRow span_row(const Stmt& s);

    std::mutex mu_;
    std::unique_ptr<Db> db_;
    std::string path_;
    std::unordered_map<int64_t, std::string> strings_;
    std::unique_ptr<Stmt> string_stmt_;
    std::unordered_map<int64_t, MemoryBlockIndex> memory_blocks_;  // by run
};

}  // namespace kv::storage
