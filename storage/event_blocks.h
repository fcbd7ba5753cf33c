// Block-range indexes of the two high-volume tables (spans, memory_events), in the manner of
// PostgreSQL's BRIN: one row per block of up to kEventBlockRows consecutive rows of one run,
// holding the block's id range and time extent. Why not B-tree indexes: a B-tree entry costs
// every inserted row a descent from the root (measured here: 0.72M events/s with the two
// B-trees against 1.2M/s with block rows, same data), and the rows are appended nearly in time
// order, so an id range per time range is almost as selective. Blocks close at every commit,
// so every committed row is in a committed block.
//
// memory_blocks also stores, per block, the memory state just before its first row
// (storage/memory_state.h). With it "the totals just before time t" needs only one block's
// state plus the rows after it, however long ago a category last changed (weights: at load).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "storage/memory_state.h"
#include "storage/sqlite_util.h"

namespace kv::storage {

constexpr int64_t kEventBlockRows = 1024;

struct SpanBlockRow {
    int64_t first_id = 0, last_id = 0, rows = 0;
    int64_t start_min = 0, end_max = 0;
};
struct MemoryBlockRow {
    int64_t first_id = 0, last_id = 0, rows = 0;
    int64_t t_min = 0, t_max = 0;
    std::vector<uint8_t> state;  // encode_memory_state() before first_id
};

// One run's blocks as its rows are written (ids ascending). The writer closes the open blocks
// before each COMMIT and rolls back to the last commit when a batch fails.
class EventBlockBuilder {
   public:
    void add_span(int64_t id, int64_t start_ns, int64_t end_ns);
    void add_memory(int64_t id, int64_t t_ns, int device, int category, int64_t category_total, int64_t device_total);
    // Closes the open blocks; returns and forgets every finished block.
    void close(std::vector<SpanBlockRow>& spans, std::vector<MemoryBlockRow>& memory);
    // After a successful commit: the current state is the one to return to.
    void commit() { committed_ = state_; }
    // After a failed batch: drops the batch's blocks and state.
    void rollback();
    const MemoryState& state() const { return state_; }
    // Starts from a run's state as already recorded (before any row is added).
    void resume(MemoryState s) { state_ = committed_ = std::move(s); }

   private:
    MemoryState state_, committed_;
    bool span_open_ = false, mem_open_ = false;
    SpanBlockRow span_;
    MemoryBlockRow mem_;
    std::vector<SpanBlockRow> span_done_;
    std::vector<MemoryBlockRow> mem_done_;
};

// The block rows' INSERT statements (writer and migration).
class EventBlockInserts {
   public:
    explicit EventBlockInserts(Db& db);
    void write(int64_t run, const std::vector<SpanBlockRow>& spans, const std::vector<MemoryBlockRow>& memory);

   private:
    Stmt span_, memory_;
};

// The state after every memory event of `run` recorded so far: its last block's state with the
// block's rows folded in.
MemoryState memory_state_after(Db& db, int64_t run);

// Migration from schema 1: builds the blocks of every row already in the file.
void rebuild_event_blocks(Db& db);

}  // namespace kv::storage
