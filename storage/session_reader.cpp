// SessionReader (see session_reader.h). Readers hold a read transaction only for the duration
// of one call, so the writer's PASSIVE checkpoints can reclaim the WAL between GUI refreshes.
//
// Index (sections marked "// ---- name ----")
//   helpers, strings         id ranges, limits, StringIds lookups
//   runs
//   memory                   rows, the block index, windows, decimated timelines
//   spans
//   cache, scores, cells     cache_steps (replay-log blobs), score snapshots, cells
//   metrics, logs, GPU       and count_rows
#include "session_reader.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>

#include "storage/event_blocks.h"
#include "storage/record_tables.h"
#include "storage/sample_tokens.h"
#include "storage/session.h"
#include "storage/session_file.h"

namespace kv::storage {

namespace {
// Select lists of the column tables (storage/record_tables.h); span_row and memory_row decode them.
const std::string kMemoryColumns = tables::memory_events().select_list();
const std::string kSpanColumns = tables::spans().select_list();

bool full_window(const TimeWindow& w) {
    return w.t0_ns == std::numeric_limits<int64_t>::min() && w.t1_ns == std::numeric_limits<int64_t>::max();
}

// Appends the id range [a, b], merged into the previous one when adjacent or overlapping.
void add_id_range(std::vector<std::pair<int64_t, int64_t>>& out, int64_t a, int64_t b) {
    if (!out.empty() && a <= out.back().second + 1)
        out.back().second = std::max(out.back().second, b);
    else
        out.push_back({a, b});
}

// Id ranges of a run's span blocks (storage/event_blocks.h) that may hold spans overlapping
// [t0, t1) with id > after_id. Span windows are not on the GUI's per-frame path, so the blocks
// table is scanned here (memory windows use SessionReader's in-memory block index).
std::vector<std::pair<int64_t, int64_t>> span_ranges(Db& db, int64_t run, const TimeWindow& w, int64_t after_id) {
    std::vector<std::pair<int64_t, int64_t>> out;
    Stmt s = db.prepare(
        "SELECT first_id, last_id FROM span_blocks WHERE run_id = ?1 AND start_min < ?3 AND end_max >= ?2 AND last_id > ?4 "
        "ORDER BY first_id");
    s.bind(1, run).bind(2, w.t0_ns).bind(3, w.t1_ns).bind(4, after_id);
    while (s.step()) add_id_range(out, std::max(s.i64(0), after_id + 1), s.i64(1));
    return out;
}

bool by_time(const MemoryEventRow& a, const MemoryEventRow& b) { return a.t_ns != b.t_ns ? a.t_ns < b.t_ns : a.id < b.id; }

int64_t clamp_limit(size_t limit) {
    return limit > size_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(limit);
}
}  // namespace

SessionReader::SessionReader(const std::string& path) : db_(open_session_db(path, OpenMode::READ_ONLY)), path_(path) {}

SessionReader::~SessionReader() = default;

const std::string& SessionReader::string_locked(int64_t id) {
    auto it = strings_.find(id);
    if (it != strings_.end()) return it->second;
    if (!string_stmt_) string_stmt_ = std::make_unique<Stmt>(*db_, "SELECT value FROM StringIds WHERE id=?");
    string_stmt_->bind(1, id);
    std::string v = string_stmt_->step() ? string_stmt_->text(0) : std::string();
    string_stmt_->reset();
    return strings_.emplace(id, std::move(v)).first->second;
}

std::string SessionReader::string(int64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    return string_locked(id);
}

// ---- runs -------------------------------------------------------------------------------
std::vector<RunInfo> SessionReader::runs() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<RunInfo> out;
    Stmt s = db_->prepare(str("SELECT ", kRunColumns, " FROM runs ORDER BY id"));
    while (s.step()) out.push_back(run_from_row(s));
    return out;
}

RunInfo SessionReader::run(int64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare(str("SELECT ", kRunColumns, " FROM runs WHERE id=?"));
    s.bind(1, id);
    if (!s.step()) throw SessionError(SessionErrorKind::INVALID, str("session '", path_, "' has no run ", id));
    return run_from_row(s);
}

// ---- memory -----------------------------------------------------------------------------
MemoryEventRow SessionReader::memory_row(const Stmt& s, bool with_label) {
    tables::MemoryEventRead r;
    tables::memory_events().read(s, r);
    if (with_label) r.row.label = string_locked(r.label_id);
    return std::move(r.row);
}

std::vector<MemoryEventRow> SessionReader::memory_events(int64_t run, const TimeWindow& w, int64_t after_id,
                                                         size_t limit) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<MemoryEventRow> out;
    if (full_window(w)) {
        // "+run_id" keeps SQLite on the rowid range, so following a live run costs only the
        // new rows.
        Stmt s = db_->prepare(
            str("SELECT ", kMemoryColumns, " FROM memory_events WHERE id > ?2 AND +run_id = ?1 ORDER BY id LIMIT ?3"));
        s.bind(1, run).bind(2, after_id).bind(3, clamp_limit(limit));
        while (s.step()) out.push_back(memory_row(s));
        return out;
    }
    return sorted_memory_window_locked(run, w, after_id, limit);
}

std::vector<MemoryEventRow> SessionReader::sorted_memory_window_locked(int64_t run, const TimeWindow& w, int64_t after_id,
                                                                        size_t limit) {
    // Rows without their label text first (a wide window may hold far more rows than `limit`),
    // then the first `limit` in time order get theirs.
    std::vector<MemoryEventRow> rows;
    std::vector<int64_t> labels;
    {
        Transaction snapshot(*db_, /*immediate=*/false);
        memory_window_locked(
            run, w, after_id, -2,
            [&](const Stmt& s) {
                rows.push_back(memory_row(s, false));
                labels.push_back(s.i64(5));
            },
            limit);
        snapshot.commit();
    }
    std::vector<uint32_t> order(rows.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = uint32_t(i);
    auto earlier = [&](uint32_t a, uint32_t b) { return by_time(rows[a], rows[b]); };
    const size_t keep = std::min(limit, order.size());
    if (keep == order.size())
        std::sort(order.begin(), order.end(), earlier);
    else
        std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), earlier);
    std::vector<MemoryEventRow> sorted;
    sorted.reserve(keep);
    for (size_t i = 0; i < keep; ++i) {
        sorted.push_back(std::move(rows[order[i]]));
        sorted.back().label = string_locked(labels[order[i]]);
    }
    return sorted;
}

SessionReader::MemoryBlockIndex& SessionReader::memory_blocks_locked(int64_t run) {
    MemoryBlockIndex& ix = memory_blocks_[run];
    Stmt s = db_->prepare(
        "SELECT rowid, first_id, last_id, t_min, t_max FROM memory_blocks WHERE rowid > ?1 AND run_id = ?2 ORDER BY rowid");
    s.bind(1, ix.last_rowid).bind(2, run);
    const size_t old = ix.blocks.size();
    while (s.step()) {
        ix.last_rowid = s.i64(0);
        ix.blocks.push_back({s.i64(1), s.i64(2), s.i64(3), s.i64(4)});
    }
    if (ix.blocks.size() != old) {
        const size_t n = ix.blocks.size();
        ix.prefix_max_t_max.resize(n);
        for (size_t i = old; i < n; ++i)
            ix.prefix_max_t_max[i] = i ? std::max(ix.prefix_max_t_max[i - 1], ix.blocks[i].t_max) : ix.blocks[i].t_max;
        ix.suffix_min_t_min.resize(n);
        for (size_t i = n; i-- > 0;)
            ix.suffix_min_t_min[i] = i + 1 < n ? std::min(ix.suffix_min_t_min[i + 1], ix.blocks[i].t_min) : ix.blocks[i].t_min;
    }
    return ix;
}

size_t SessionReader::first_memory_block_reaching_locked(int64_t run, int64_t t) {
    const MemoryBlockIndex& ix = memory_blocks_locked(run);
    return size_t(std::lower_bound(ix.prefix_max_t_max.begin(), ix.prefix_max_t_max.end(), t) - ix.prefix_max_t_max.begin());
}

std::vector<std::pair<int64_t, int64_t>> SessionReader::memory_ranges_locked(int64_t run, const TimeWindow& w,
                                                                             int64_t after_id) {
    const MemoryBlockIndex& ix = memory_blocks_locked(run);
    // Blocks before lo end before t0; blocks from hi on start at or after t1.
    const size_t lo = first_memory_block_reaching_locked(run, w.t0_ns);
    const size_t hi =
        size_t(std::lower_bound(ix.suffix_min_t_min.begin(), ix.suffix_min_t_min.end(), w.t1_ns) - ix.suffix_min_t_min.begin());
    std::vector<std::pair<int64_t, int64_t>> out;
    for (size_t i = lo; i < hi && i < ix.blocks.size(); ++i) {
        const BlockExtent& b = ix.blocks[i];
        if (b.t_min >= w.t1_ns || b.t_max < w.t0_ns || b.last_id <= after_id) continue;
        add_id_range(out, std::max(b.first_id, after_id + 1), b.last_id);
    }
    return out;
}

void SessionReader::memory_window_locked(int64_t run, const TimeWindow& w, int64_t after_id, int device,
                                         const std::function<void(const Stmt&)>& row, size_t first_n) {
    Stmt s = db_->prepare(str("SELECT ", kMemoryColumns,
                              " FROM memory_events WHERE id BETWEEN ?1 AND ?2 AND run_id = ?3 AND t_ns >= ?4 AND t_ns < ?5 "
                              "AND (?6 = -2 OR device = ?6)"));
    if (first_n == 0 || first_n > (size_t(1) << 16)) {
        for (const auto& [a, b] : memory_ranges_locked(run, w, after_id)) {
            s.bind(1, a).bind(2, b).bind(3, run).bind(4, w.t0_ns).bind(5, w.t1_ns).bind(6, device);
            while (s.step()) row(s);
            s.reset();
        }
        return;
    }
    // Only the first `first_n` rows in (t_ns, id) order are wanted (slices of a wide window):
    // block by block, stopping once no later block can hold an earlier row than the n-th
    // earliest seen (later blocks have larger ids, so an equal time sorts after it).
    const MemoryBlockIndex& ix = memory_blocks_locked(run);
    const size_t lo = first_memory_block_reaching_locked(run, w.t0_ns);
    std::priority_queue<std::pair<int64_t, int64_t>> earliest;  // the first_n earliest (t, id), latest on top
    for (size_t i = lo; i < ix.blocks.size(); ++i) {
        if (ix.suffix_min_t_min[i] >= w.t1_ns) break;
        if (earliest.size() == first_n && ix.suffix_min_t_min[i] >= earliest.top().first) break;
        const BlockExtent& b = ix.blocks[i];
        if (b.t_min >= w.t1_ns || b.t_max < w.t0_ns || b.last_id <= after_id) continue;
        s.bind(1, std::max(b.first_id, after_id + 1)).bind(2, b.last_id).bind(3, run).bind(4, w.t0_ns).bind(5, w.t1_ns).bind(6, device);
        while (s.step()) {
            row(s);
            earliest.push({s.i64(1), s.i64(0)});
            if (earliest.size() > first_n) earliest.pop();
        }
        s.reset();
    }
}

void SessionReader::for_each_memory_event(int64_t run, const TimeWindow& w,
                                          const std::function<void(const MemoryEventRow&)>& fn) {
    std::lock_guard<std::mutex> lk(mu_);
    if (full_window(w)) {
        // Every row of the run, sorted by SQLite (may spill to a temporary file): exports.
        Stmt s = db_->prepare(str("SELECT ", kMemoryColumns, " FROM memory_events WHERE run_id = ?1 ORDER BY t_ns, id"));
        s.bind(1, run);
        while (s.step()) fn(memory_row(s));
        return;
    }
    for (const MemoryEventRow& r : sorted_memory_window_locked(run, w, 0, std::numeric_limits<size_t>::max())) fn(r);
}

std::vector<int> SessionReader::memory_devices(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<int> out;
    // Linear in the run's memory events (no index on device); views get the devices from the
    // run summary's peak_bytes instead and call this only for exports.
    Stmt s = db_->prepare("SELECT DISTINCT device FROM memory_events WHERE run_id = ? ORDER BY device");
    s.bind(1, run);
    while (s.step()) out.push_back(s.i32(0));
    return out;
}

std::vector<MemoryBucket> SessionReader::memory_timeline(int64_t run, int device, const TimeWindow& window,
                                                         int buckets) {
    std::lock_guard<std::mutex> lk(mu_);
    if (buckets < 1) buckets = 1;
    Transaction snapshot(*db_, /*immediate=*/false);
    TimeWindow w = window;
    if (full_window(w)) {
        const MemoryBlockIndex& ix = memory_blocks_locked(run);
        if (ix.blocks.empty()) return {};
        w.t0_ns = ix.suffix_min_t_min.front();
        w.t1_ns = ix.prefix_max_t_max.back() + 1;
    }
    if (w.t1_ns <= w.t0_ns) return {};
    // State at the window start: the latest event before it, by (t_ns, id), per category and
    // for the device total. Blocks whose rows all precede t0 are summed up in the state of the
    // first block that may reach t0; rows from there on before t0 are folded in.
    MemoryState state;
    {
        const size_t first = first_memory_block_reaching_locked(run, w.t0_ns);
        const MemoryBlockIndex& ix = memory_blocks_[run];
        int64_t from_id = 0;
        if (first < ix.blocks.size()) {
            from_id = ix.blocks[first].first_id;
            Stmt b = db_->prepare("SELECT state FROM memory_blocks WHERE run_id = ?1 AND first_id = ?2");
            b.bind(1, run).bind(2, from_id);
            if (!b.step())
                throw SessionError(SessionErrorKind::DAMAGED,
                                   str("session '", path_, "': memory block at id ", from_id, " of run ", run, " vanished"));
            state = decode_memory_state(b.blob(0), b.bytes(0));
        } else {
            state = memory_state_after(*db_, run);  // every event precedes the window
            from_id = std::numeric_limits<int64_t>::max();
        }
        if (from_id != std::numeric_limits<int64_t>::max()) {
            const TimeWindow before{std::numeric_limits<int64_t>::min() + 1, w.t0_ns};
            Stmt rows = db_->prepare(
                "SELECT id, t_ns, device, category, category_total, device_total FROM memory_events "
                "WHERE id BETWEEN ?1 AND ?2 AND run_id = ?3 AND t_ns < ?4");
            for (const auto& [a, z] : memory_ranges_locked(run, before, from_id - 1)) {
                rows.bind(1, a).bind(2, z).bind(3, run).bind(4, w.t0_ns);
                while (rows.step())
                    memory_state_apply(state, rows.i32(2), rows.i32(3), rows.i64(1), rows.i64(0), rows.i64(4), rows.i64(5));
                rows.reset();
            }
        }
    }
    std::array<int64_t, kNumMemCategories> cat{};
    int64_t total = 0;
    if (auto it = state.find(device); it != state.end()) {
        total = it->second.total.value;
        for (size_t c = 0; c < kNumMemCategories; ++c) cat[c] = it->second.category[c].value;
    }
    std::vector<MemoryBucket> out(static_cast<size_t>(buckets));
    for (int b = 0; b < buckets; ++b) {
        out[size_t(b)].t0_ns = bucket_start(w.t0_ns, w.t1_ns, buckets, b);
        out[size_t(b)].t1_ns = bucket_start(w.t0_ns, w.t1_ns, buckets, b + 1);
    }
    struct Ev {
        int64_t t_ns, id, category_total, device_total;
        int category;
    };
    std::vector<Ev> evs;
    memory_window_locked(run, w, 0, device, [&](const Stmt& s) {
        evs.push_back({s.i64(1), s.i64(0), s.i64(8), s.i64(9), s.i32(3)});
    });
    std::sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.t_ns != b.t_ns ? a.t_ns < b.t_ns : a.id < b.id; });
    int filled = 0;  // buckets before this index are final
    auto carry_until = [&](int b) {
        for (; filled < b; ++filled) {
            MemoryBucket& m = out[size_t(filled)];
            if (m.events == 0) {
                m.total_min = m.total_max = m.total_last = total;
                m.at_max = cat;
            }
        }
    };
    for (const Ev& e : evs) {
        const int b = bucket_index(e.t_ns, w.t0_ns, w.t1_ns, buckets);
        carry_until(b);
        if (e.category >= 0 && size_t(e.category) < kNumMemCategories) cat[size_t(e.category)] = e.category_total;
        total = e.device_total;
        MemoryBucket& m = out[size_t(b)];
        if (m.events == 0) {
            m.total_min = m.total_max = total;
            m.at_max = cat;
        } else {
            m.total_min = std::min(m.total_min, total);
            if (total > m.total_max) {
                m.total_max = total;
                m.at_max = cat;
            }
        }
        m.total_last = total;
        ++m.events;
    }
    carry_until(buckets);
    snapshot.commit();
    return out;
}

// ---- spans ------------------------------------------------------------------------------
SpanRow SessionReader::span_row(const Stmt& s) {
    tables::SpanRead r;
    tables::spans().read(s, r);
    r.row.name = string_locked(r.name_id);
    return std::move(r.row);
}

std::vector<SpanRow> SessionReader::spans(int64_t run, const TimeWindow& w, int64_t after_id, size_t limit) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<SpanRow> out;
    if (full_window(w)) {
        Stmt s = db_->prepare(
            str("SELECT ", kSpanColumns, " FROM spans WHERE id > ?2 AND +run_id = ?1 ORDER BY id LIMIT ?3"));
        s.bind(1, run).bind(2, after_id).bind(3, clamp_limit(limit));
        while (s.step()) out.push_back(span_row(s));
    } else {
        Transaction snapshot(*db_, /*immediate=*/false);
        Stmt s = db_->prepare(str("SELECT ", kSpanColumns,
                                  " FROM spans WHERE id BETWEEN ?1 AND ?2 AND run_id = ?3 AND start_ns < ?4 AND end_ns >= ?5"));
        for (const auto& [a, b] : span_ranges(*db_, run, w, after_id)) {
            s.bind(1, a).bind(2, b).bind(3, run).bind(4, w.t1_ns).bind(5, w.t0_ns);
            while (s.step()) {
                const int64_t start = s.i64(1), end = s.i64(2);
                const bool overlaps = end > w.t0_ns || (start == end && start >= w.t0_ns);
                if (overlaps) out.push_back(span_row(s));
            }
            s.reset();
        }
        snapshot.commit();
    }
    std::sort(out.begin(), out.end(), [](const SpanRow& a, const SpanRow& b) {
        return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.id < b.id;
    });
    if (out.size() > limit) out.resize(limit);
    return out;
}

void SessionReader::for_each_span(int64_t run, const std::function<void(const SpanRow&)>& fn) {
    std::lock_guard<std::mutex> lk(mu_);
    // Ordered by start through a temporary sort; exports only.
    Stmt s = db_->prepare(str("SELECT ", kSpanColumns, " FROM spans WHERE run_id = ?1 ORDER BY start_ns, id"));
    s.bind(1, run);
    while (s.step()) fn(span_row(s));
}

// ---- cache, scores, cells ---------------------------------------------------------------
std::vector<CacheStepRow> SessionReader::cache_steps(int64_t run, int layer, int64_t after_id, size_t limit) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<CacheStepRow> out;
    const auto& t = tables::cache_steps();
    Stmt s = db_->prepare(str("SELECT ", t.select_list(), " FROM cache_steps WHERE run_id = ?1 AND ",
                              layer >= 0 ? "layer = ?2 AND id > ?3 ORDER BY chunk, id" : "?2 < 0 AND id > ?3 ORDER BY layer, chunk, id",
                              " LIMIT ?4"));
    s.bind(1, run).bind(2, layer).bind(3, after_id).bind(4, clamp_limit(limit));
    while (s.step()) {
        CacheStepRow r;
        t.read(s, r);
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<ScoreRow> SessionReader::score_snapshots(int64_t run, int layer, int64_t after_id, bool with_values,
                                                     size_t limit) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<ScoreRow> out;
    const auto& t = tables::score_snapshots();
    Stmt s = db_->prepare(str("SELECT ", t.select_list(), ", scores IS NOT NULL, ", with_values ? "scores" : "NULL",
                              " FROM score_snapshots WHERE run_id = ?1 AND ", layer >= 0 ? "layer = ?2" : "?2 < 0",
                              " AND id > ?3 ORDER BY layer, chunk, id LIMIT ?4"));
    s.bind(1, run).bind(2, layer).bind(3, after_id).bind(4, clamp_limit(limit));
    while (s.step()) {
        ScoreRow r;
        const int has = t.read(s, r), values = has + 1;
        r.has_values = s.i64(has) != 0;
        if (with_values && r.has_values) {
            r.values.resize(s.bytes(values) / sizeof(float));
            if (!r.values.empty()) std::memcpy(r.values.data(), s.blob(values), r.values.size() * sizeof(float));
        }
        out.push_back(std::move(r));
    }
    return out;
}

std::vector<CellRow> SessionReader::cells(int64_t run, int64_t after_id) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<CellRow> out;
    const auto& t = tables::cells();
    Stmt s = db_->prepare(str("SELECT ", t.select_list(), " FROM cells WHERE run_id = ?1 AND id > ?2 ORDER BY id"));
    s.bind(1, run).bind(2, after_id);
    while (s.step()) {
        CellRow c;
        t.read(s, c);
        out.push_back(c);
    }
    return out;
}

// ---- metrics, logs, GPU -----------------------------------------------------------------
std::vector<MetricRow> SessionReader::metrics(int64_t run, const std::string& name, int64_t after_id) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<MetricRow> out;
    const auto& t = tables::metrics();
    Stmt s = db_->prepare(str("SELECT ", t.select_list(), " FROM metrics WHERE run_id = ?1 AND ",
                              name.empty() ? "?2 = '' AND id > ?3 ORDER BY id" : "name = ?2 AND id > ?3 ORDER BY step, id"));
    s.bind(1, run).bind(2, std::string_view(name)).bind(3, after_id);
    while (s.step()) {
        MetricRow m;
        t.read(s, m);
        out.push_back(std::move(m));
    }
    return out;
}

std::vector<SampleTokensRow> SessionReader::sample_tokens(int64_t run, int64_t after_id, bool with_pieces) {
    std::lock_guard<std::mutex> lk(mu_);
    return select_sample_tokens(*db_, run, after_id, with_pieces);
}

std::vector<std::string> SessionReader::metric_names(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::string> out;
    Stmt s = db_->prepare("SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name");
    s.bind(1, run);
    while (s.step()) out.push_back(s.text(0));
    return out;
}

std::vector<LogRow> SessionReader::logs(int64_t run, int64_t after_id, size_t limit) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<LogRow> out;
    const auto& t = tables::logs();
    Stmt s = db_->prepare(str("SELECT ", t.select_list(), " FROM logs WHERE run_id = ?1 AND id > ?2 ORDER BY id LIMIT ?3"));
    s.bind(1, run).bind(2, after_id).bind(3, clamp_limit(limit));
    while (s.step()) {
        LogRow l;
        t.read(s, l);
        out.push_back(std::move(l));
    }
    return out;
}

std::vector<GpuActivityRow> SessionReader::gpu_activity(int64_t run) {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<GpuActivityRow> out;
    Transaction snapshot(*db_, /*immediate=*/false);
    const char* ext =
        "(SELECT externalId FROM CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION x WHERE x.run_id = ?1 AND "
        "x.correlationId = t.correlationId LIMIT 1)";
    {
        Stmt s = db_->prepare(str("SELECT start, \"end\", deviceId, streamId, correlationId, ", ext,
                                  ", shortName FROM CUPTI_ACTIVITY_KIND_KERNEL t WHERE run_id = ?1"));
        s.bind(1, run);
        while (s.step()) {
            GpuActivityRow r;
            r.kind = GpuActivityRow::KERNEL;
            r.start_ns = s.i64(0);
            r.end_ns = s.i64(1);
            r.device = s.i32(2);
            r.stream = s.i32(3);
            r.correlation_id = s.i64(4);
            r.external_id = s.is_null(5) ? 0 : s.i64(5);
            r.name = string_locked(s.i64(6));
            out.push_back(std::move(r));
        }
    }
    {
        static const char* const kCopyKinds[] = {"unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                                 "AtoD",    "DtoA", "DtoD", "HtoH", "PtoP"};
        // Copies and sets share their columns; a copy also names its direction.
        auto transfers = [&](const char* table, GpuActivityRow::Kind kind) {
            const bool copy = kind == GpuActivityRow::MEMCPY;
            Stmt s = db_->prepare(str("SELECT start, \"end\", deviceId, streamId, correlationId, ", ext, ", bytes", copy ? ", copyKind" : "",
                                      " FROM ", table, " t WHERE run_id = ?1"));
            s.bind(1, run);
            while (s.step()) {
                GpuActivityRow r;
                r.kind = kind;
                r.start_ns = s.i64(0);
                r.end_ns = s.i64(1);
                r.device = s.i32(2);
                r.stream = s.i32(3);
                r.correlation_id = s.i64(4);
                r.external_id = s.is_null(5) ? 0 : s.i64(5);
                r.bytes = s.i64(6);
                const int k = copy ? s.i32(7) : 0;
                r.name = copy ? str("memcpy ", k >= 0 && k <= 10 ? kCopyKinds[k] : "unknown") : std::string("memset");
                out.push_back(std::move(r));
            }
        };
        transfers("CUPTI_ACTIVITY_KIND_MEMCPY", GpuActivityRow::MEMCPY);
        transfers("CUPTI_ACTIVITY_KIND_MEMSET", GpuActivityRow::MEMSET);
    }
    snapshot.commit();
    std::sort(out.begin(), out.end(),
              [](const GpuActivityRow& a, const GpuActivityRow& b) { return a.start_ns < b.start_ns; });
    return out;
}

int64_t SessionReader::count_rows(const std::string& table, int64_t run) {
    static const char* const kTables[] = {"spans",
                                          "memory_events",
                                          "cache_steps",
                                          "score_snapshots",
                                          "cells",
                                          "metrics",
                                          "logs",
                                          "CUPTI_ACTIVITY_KIND_KERNEL",
                                          "CUPTI_ACTIVITY_KIND_MEMCPY",
                                          "CUPTI_ACTIVITY_KIND_MEMSET",
                                          "CUDA_GPU_MEMORY_USAGE_EVENTS",
                                          "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION"};
    bool known = false;
    for (const char* t : kTables) known |= table == t;
    if (!known) throw SessionError(SessionErrorKind::INVALID, str("count_rows: '", table, "' is not an event table"));
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s = db_->prepare(str("SELECT count(*) FROM ", table, " WHERE run_id = ?"));
    s.bind(1, run);
    return s.step() ? s.i64(0) : 0;
}

}  // namespace kv::storage
