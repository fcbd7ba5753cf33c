// Block-range indexes (see event_blocks.h).
#include "storage/event_blocks.h"

#include <algorithm>

#include "storage/sqlite_util.h"

namespace kv::storage {

void EventBlockBuilder::add_span(int64_t id, int64_t start_ns, int64_t end_ns) {
    if (!span_open_) {
        span_ = {id, id, 0, start_ns, end_ns};
        span_open_ = true;
    }
    span_.last_id = id;
    ++span_.rows;
    span_.start_min = std::min(span_.start_min, start_ns);
    span_.end_max = std::max(span_.end_max, end_ns);
    if (span_.rows == kEventBlockRows) {
        span_done_.push_back(span_);
        span_open_ = false;
    }
}

void EventBlockBuilder::add_memory(int64_t id, int64_t t_ns, int device, int category, int64_t category_total,
                                   int64_t device_total) {
    if (!mem_open_) {
        mem_ = {id, id, 0, t_ns, t_ns, encode_memory_state(state_)};
        mem_open_ = true;
    }
    mem_.last_id = id;
    ++mem_.rows;
    mem_.t_min = std::min(mem_.t_min, t_ns);
    mem_.t_max = std::max(mem_.t_max, t_ns);
    memory_state_apply(state_, device, category, t_ns, id, category_total, device_total);
    if (mem_.rows == kEventBlockRows) {
        mem_done_.push_back(std::move(mem_));
        mem_open_ = false;
    }
}

void EventBlockBuilder::close(std::vector<SpanBlockRow>& spans, std::vector<MemoryBlockRow>& memory) {
    if (span_open_) span_done_.push_back(span_), span_open_ = false;
    if (mem_open_) mem_done_.push_back(std::move(mem_)), mem_open_ = false;
    spans.insert(spans.end(), span_done_.begin(), span_done_.end());
    for (auto& m : mem_done_) memory.push_back(std::move(m));
    span_done_.clear();
    mem_done_.clear();
}

void EventBlockBuilder::rollback() {
    state_ = committed_;
    span_open_ = mem_open_ = false;
    span_done_.clear();
    mem_done_.clear();
}

EventBlockInserts::EventBlockInserts(Db& db)
    : span_(db, "INSERT INTO span_blocks(run_id, first_id, last_id, rows, start_min, end_max) VALUES(?,?,?,?,?,?)"),
      memory_(db, "INSERT INTO memory_blocks(run_id, first_id, last_id, rows, t_min, t_max, state) VALUES(?,?,?,?,?,?,?)") {}

void EventBlockInserts::write(int64_t run, const std::vector<SpanBlockRow>& spans, const std::vector<MemoryBlockRow>& memory) {
    for (const SpanBlockRow& b : spans) {
        span_.bind(1, run).bind(2, b.first_id).bind(3, b.last_id).bind(4, b.rows).bind(5, b.start_min).bind(6, b.end_max);
        span_.insert();
    }
    for (const MemoryBlockRow& b : memory) {
        memory_.bind(1, run).bind(2, b.first_id).bind(3, b.last_id).bind(4, b.rows).bind(5, b.t_min).bind(6, b.t_max);
        memory_.bind_blob(7, b.state.data(), b.state.size());
        memory_.insert();
    }
}

MemoryState memory_state_after(Db& db, int64_t run) {
    Stmt b = db.prepare("SELECT first_id, last_id, state FROM memory_blocks WHERE run_id = ? ORDER BY first_id DESC LIMIT 1");
    b.bind(1, run);
    if (!b.step()) return {};
    MemoryState s = decode_memory_state(b.blob(2), b.bytes(2));
    Stmt rows = db.prepare(
        "SELECT id, t_ns, device, category, category_total, device_total FROM memory_events "
        "WHERE id BETWEEN ?1 AND ?2 AND run_id = ?3");
    rows.bind(1, b.i64(0)).bind(2, b.i64(1)).bind(3, run);
    while (rows.step()) memory_state_apply(s, rows.i32(2), rows.i32(3), rows.i64(1), rows.i64(0), rows.i64(4), rows.i64(5));
    return s;
}

void rebuild_event_blocks(Db& db) {
    std::map<int64_t, EventBlockBuilder> runs;
    {
        Stmt s = db.prepare("SELECT id, run_id, start_ns, end_ns FROM spans ORDER BY id");
        while (s.step()) runs[s.i64(1)].add_span(s.i64(0), s.i64(2), s.i64(3));
    }
    {
        Stmt s = db.prepare(
            "SELECT id, run_id, t_ns, device, category, category_total, device_total FROM memory_events ORDER BY id");
        while (s.step()) runs[s.i64(1)].add_memory(s.i64(0), s.i64(2), s.i32(3), s.i32(4), s.i64(5), s.i64(6));
    }
    EventBlockInserts ins(db);
    for (auto& [run, b] : runs) {
        std::vector<SpanBlockRow> spans;
        std::vector<MemoryBlockRow> memory;
        b.close(spans, memory);
        ins.write(run, spans, memory);
    }
}

}  // namespace kv::storage
