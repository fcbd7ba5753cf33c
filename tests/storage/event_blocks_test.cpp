// Block-range indexes (storage/event_blocks.h): window queries, the bucketed memory timeline and
// the memory state before a window agree with brute force over the rows read by id, on many
// blocks, out-of-order times, two devices, two runs sharing a writer, commits mid-block and a
// run attached twice; the schema-1 migration rebuilds the same blocks; the state encoding
// round-trips and rejects malformed bytes; the builder rolls back to its last commit.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/telemetry/trace.h"
#include "storage/event_blocks.h"
#include "storage/schema.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using storage::MemoryBucket;
using storage::MemoryEventRow;
using storage::SpanRow;
using storage::TimeWindow;

// Synthetic memory events of one run: two devices, times jittered so that ids (push order) and
// times disagree locally, the way per-thread queues interleave.
void push_memory(trace::Recorder& rec, std::mt19937_64& rng, int n, int64_t t_base, uint32_t label) {
    std::map<int, int64_t> dev_total;
    std::map<std::pair<int, int>, int64_t> cat_total;
    for (int i = 0; i < n; ++i) {
        trace::Event ev;
        ev.alloc = trace::AllocRecord{};
        auto& a = ev.alloc;
        a.type = trace::EventType::ALLOC;
        const int device = rng() % 5 == 0 ? trace::device_code(Device{DeviceType::CUDA, 0}) : -1;
        const int cat = int(rng() % 4) + (i < 10 ? 0 : 1);  // weights only at the start
        a.device = device;
        a.category = MemCategory(i < 10 ? 0 : cat);
        const int64_t bytes = int64_t(rng() % 4096 + 1) * (rng() % 3 == 0 ? -1 : 1);
        a.bytes = bytes;
        a.t_ns = uint64_t(t_base + i * 100 + int64_t(rng() % 700));  // overlaps ~7 neighbours
        dev_total[device] += bytes;
        cat_total[{device, int(a.category)}] += bytes;
        a.device_total = dev_total[device];
        a.category_total = cat_total[{device, int(a.category)}];
        a.label_id = label;
        a.layer = i % 7;
        a.chunk = -1;
        while (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

void push_spans(trace::Recorder& rec, std::mt19937_64& rng, int n, int64_t t_base) {
    static const trace::Name kName("blocks test span");
    for (int i = 0; i < n; ++i) {
        const int64_t start = t_base + i * 100 + int64_t(rng() % 500);
        const int shape = int(rng() % 10);
        const int64_t d = shape == 0 ? 0 : shape < 8 ? int64_t(rng() % 300) : int64_t(rng() % 400'000);  // a few long
        trace::Event ev;
        ev.span = trace::SpanRecord{};
        ev.span.type = trace::EventType::SPAN;
        ev.span.category = trace::SpanCategory::OTHER;
        ev.span.name_id = kName.id;
        ev.span.start_ns = uint64_t(start);
        ev.span.end_ns = uint64_t(start + d);
        ev.span.layer = ev.span.chunk = ev.span.cell_row = ev.span.cell_col = -1;
        while (!rec.push(ev)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
}

bool by_time(const MemoryEventRow& a, const MemoryEventRow& b) { return a.t_ns != b.t_ns ? a.t_ns < b.t_ns : a.id < b.id; }

// The reader's bucket semantics, from the rows alone: state before t0 is each slot's latest event
// by (t_ns, id); events in (t_ns, id) order; empty buckets carry the state.
std::vector<MemoryBucket> naive_timeline(std::vector<MemoryEventRow> rows, int device, int64_t t0, int64_t t1, int n) {
    std::sort(rows.begin(), rows.end(), by_time);
    std::array<int64_t, kNumMemCategories> cat{};
    int64_t total = 0;
    for (const auto& e : rows)
        if (e.device == device && e.t_ns < t0) {
            cat[size_t(e.category)] = e.category_total;
            total = e.device_total;
        }
    std::vector<MemoryBucket> out(static_cast<size_t>(n));
    const double width = double(t1 - t0) / n;
    for (int b = 0; b < n; ++b) {
        out[size_t(b)].t0_ns = t0 + int64_t(width * b);
        out[size_t(b)].t1_ns = b + 1 == n ? t1 : t0 + int64_t(width * (b + 1));
        out[size_t(b)].total_min = out[size_t(b)].total_max = out[size_t(b)].total_last = total;
        out[size_t(b)].at_max = cat;
        for (const auto& e : rows) {
            if (e.device != device || e.t_ns < out[size_t(b)].t0_ns || e.t_ns >= out[size_t(b)].t1_ns) continue;
            cat[size_t(e.category)] = e.category_total;
            total = e.device_total;
            MemoryBucket& m = out[size_t(b)];
            if (m.events == 0 || total > m.total_max) m.total_max = total, m.at_max = cat;
            m.total_min = m.events == 0 ? total : std::min(m.total_min, total);
            m.total_last = total;
            ++m.events;
        }
        if (out[size_t(b)].events == 0) {  // carried state (after the events of earlier buckets)
            out[size_t(b)].total_min = out[size_t(b)].total_max = out[size_t(b)].total_last = total;
            out[size_t(b)].at_max = cat;
        }
    }
    return out;
}

void expect_same_buckets(const std::vector<MemoryBucket>& got, const std::vector<MemoryBucket>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].t0_ns, want[i].t0_ns) << what << " bucket " << i;
        EXPECT_EQ(got[i].events, want[i].events) << what << " bucket " << i;
        EXPECT_EQ(got[i].total_min, want[i].total_min) << what << " bucket " << i;
        EXPECT_EQ(got[i].total_max, want[i].total_max) << what << " bucket " << i;
        EXPECT_EQ(got[i].total_last, want[i].total_last) << what << " bucket " << i;
        EXPECT_EQ(got[i].at_max, want[i].at_max) << what << " bucket " << i;
    }
}

struct BlockSession {
    test::ScratchDir dir;
    std::string path = dir.file("blocks.kvlab");
    int64_t run_a = 0, run_b = 0;
    int64_t t_base = 5'000'000'000;
    BlockSession() {
        auto session = storage::Session::create(path);
        run_a = session->create_run("a");
        run_b = session->create_run("b");
        session->start_run(run_a);
        session->start_run(run_b);
        std::mt19937_64 rng(test::seed_for("EventBlocks.session"));
        const uint32_t label = trace::intern("blocks test label");
        storage::WriterOptions wo;
        wo.batch_rows = 3000;  // commits close blocks mid-way (blocks of < 1024 rows too)
        trace::Recorder ra(trace::RecorderOptions{size_t(1) << 15, 8}), rb(trace::RecorderOptions{size_t(1) << 15, 8});
        {
            storage::SessionWriter w(path, wo);
            w.attach(run_a, ra);
            w.attach(run_b, rb);
            push_memory(ra, rng, 6000, t_base, label);
            push_memory(rb, rng, 2500, t_base, label);  // interleaves ids with run a
            push_spans(ra, rng, 5000, t_base);
            w.detach(run_b);
            w.detach(run_a);
            // Attached again (resumed training): the state continues from the recorded rows.
            w.attach(run_a, ra);
            push_memory(ra, rng, 3000, t_base + 6000 * 100, label);
            w.detach(run_a);
        }
    }
};

TEST(EventBlocks, WindowQueriesAndTimelineMatchBruteForce) {
    BlockSession s;
    storage::SessionReader r(s.path);
    std::mt19937_64 rng(test::seed_for("EventBlocks.windows"));
    for (int64_t run : {s.run_a, s.run_b}) {
        const std::vector<MemoryEventRow> all = r.memory_events(run);  // by id: no block index involved
        ASSERT_EQ(all.size(), run == s.run_a ? 9000u : 2500u);
        const int64_t lo = std::min_element(all.begin(), all.end(), by_time)->t_ns;
        const int64_t hi = std::max_element(all.begin(), all.end(), by_time)->t_ns + 1;
        std::uniform_int_distribution<int64_t> t(lo - 1000, hi + 1000);
        for (int q = 0; q < 25; ++q) {
            int64_t a = t(rng), b = a + (q % 4 == 0 ? int64_t(rng() % 300) + 1 : int64_t(rng() % 400'000) + 1);
            std::vector<MemoryEventRow> want;
            for (const auto& e : all)
                if (e.t_ns >= a && e.t_ns < b) want.push_back(e);
            std::sort(want.begin(), want.end(), by_time);
            const auto got = r.memory_events(run, {a, b});
            ASSERT_EQ(got.size(), want.size()) << "window [" << a << ", " << b << ")";
            for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].id, want[i].id);
            std::vector<int64_t> each;
            r.for_each_memory_event(run, {a, b}, [&](const MemoryEventRow& e) { each.push_back(e.id); });
            ASSERT_EQ(each.size(), want.size());
            for (size_t i = 0; i < each.size(); ++i) EXPECT_EQ(each[i], want[i].id);
            // limit and after_id keep the first rows in time order among ids above after_id
            for (size_t n : {size_t(1), size_t(3), size_t(500), size_t(4000)}) {
                const auto lim = r.memory_events(run, {a, b}, 0, n);
                ASSERT_EQ(lim.size(), std::min(n, want.size()));
                for (size_t i = 0; i < lim.size(); ++i) ASSERT_EQ(lim[i].id, want[i].id) << "limit " << n << " row " << i;
            }
            // slices: after_id keeps the rows above it, still in time order
            if (!want.empty()) {
                const int64_t cut = want[want.size() / 2].id;
                std::vector<int64_t> above;
                for (const auto& e : want)
                    if (e.id > cut) above.push_back(e.id);
                const auto sl = r.memory_events(run, {a, b}, cut, 100);
                ASSERT_EQ(sl.size(), std::min<size_t>(100, above.size()));
                for (size_t i = 0; i < sl.size(); ++i) ASSERT_EQ(sl[i].id, above[i]);
            }
            for (int device : {-1, int(trace::device_code(Device{DeviceType::CUDA, 0}))})
                expect_same_buckets(r.memory_timeline(run, device, {a, b}, 7), naive_timeline(all, device, a, b, 7),
                                    str("run ", run, " device ", device, " window ", a, "..", b));
        }
        expect_same_buckets(r.memory_timeline(run, -1, {}, 33), naive_timeline(all, -1, lo, hi, 33), "whole run");
        // A window after every event: the state is the final one.
        expect_same_buckets(r.memory_timeline(run, -1, {hi + 10, hi + 20}, 2), naive_timeline(all, -1, hi + 10, hi + 20, 2),
                            "after the run");
        std::vector<int64_t> full;
        r.for_each_memory_event(run, {}, [&](const MemoryEventRow& e) { full.push_back(e.id); });
        std::vector<MemoryEventRow> sorted = all;
        std::sort(sorted.begin(), sorted.end(), by_time);
        ASSERT_EQ(full.size(), sorted.size());
        for (size_t i = 0; i < full.size(); ++i) EXPECT_EQ(full[i], sorted[i].id);
    }
    // Spans: more than a few blocks, a few long ones whose blocks overlap many windows.
    const std::vector<SpanRow> spans = r.spans(s.run_a);
    ASSERT_EQ(spans.size(), 5000u);
    EXPECT_TRUE(r.spans(s.run_b).empty());
    std::uniform_int_distribution<int64_t> t(s.t_base - 1000, s.t_base + 5000 * 100 + 500'000);
    for (int q = 0; q < 40; ++q) {
        int64_t a = t(rng), b = a + (q % 5 == 0 ? 1 : int64_t(rng() % 50'000) + 1);
        std::vector<int64_t> want, got;
        for (const auto& sp : spans)
            if ((sp.end_ns > a && sp.start_ns < b) || (sp.start_ns == sp.end_ns && sp.start_ns >= a && sp.start_ns < b))
                want.push_back(sp.id);
        for (const auto& sp : r.spans(s.run_a, {a, b})) got.push_back(sp.id);
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, want) << "window [" << a << ", " << b << ")";
    }
}

TEST(EventBlocks, AReaderOpenWhileARunGrowsSeesTheNewBlocks) {
    test::ScratchDir dir;
    const std::string path = dir.file("live.kvlab");
    int64_t run = 0;
    {
        auto session = storage::Session::create(path);
        run = session->create_run("live");
        session->start_run(run);
    }
    std::mt19937_64 rng(test::seed_for("EventBlocks.live"));
    const uint32_t label = trace::intern("live label");
    trace::Recorder rec(trace::RecorderOptions{size_t(1) << 15, 8});
    storage::SessionWriter w(path);
    w.attach(run, rec);
    push_memory(rec, rng, 3000, 1'000'000, label);
    w.flush();
    storage::SessionReader r(path);  // caches the blocks it has seen
    const TimeWindow late{1'000'000 + 2500 * 100, 1'000'000 + 4000 * 100};
    EXPECT_EQ(r.memory_events(run, late).size(), 0u + [&] {
        size_t n = 0;
        for (const auto& e : r.memory_events(run)) n += e.t_ns >= late.t0_ns && e.t_ns < late.t1_ns;
        return n;
    }());
    push_memory(rec, rng, 3000, 1'000'000 + 3000 * 100, label);
    w.detach(run);
    const auto all = r.memory_events(run);
    ASSERT_EQ(all.size(), 6000u);
    size_t want = 0;
    for (const auto& e : all) want += e.t_ns >= late.t0_ns && e.t_ns < late.t1_ns;
    EXPECT_EQ(r.memory_events(run, late).size(), want) << "rows committed after the reader's first query are found";
    const int64_t lo = std::min_element(all.begin(), all.end(), by_time)->t_ns;
    const int64_t hi = std::max_element(all.begin(), all.end(), by_time)->t_ns + 1;
    expect_same_buckets(r.memory_timeline(run, -1, {}, 20), naive_timeline(all, -1, lo, hi, 20), "whole grown run");
    expect_same_buckets(r.memory_timeline(run, -1, late, 9), naive_timeline(all, -1, late.t0_ns, late.t1_ns, 9), "late window");
}

TEST(EventBlocks, TwoWritersOnOneSessionKeepEveryRowAndBlock) {
    // Two writers (as two processes would: the CLI and the GUI on one session) take turns at
    // the write lock; each re-reads the row ids at the start of its batch.
    test::ScratchDir dir;
    const std::string path = dir.file("two.kvlab");
    int64_t run1 = 0, run2 = 0;
    {
        auto session = storage::Session::create(path);
        run1 = session->create_run("one");
        run2 = session->create_run("two");
        session->start_run(run1);
        session->start_run(run2);
    }
    const uint32_t label = trace::intern("two writers");
    trace::Recorder rec1(trace::RecorderOptions{size_t(1) << 15, 8}), rec2(trace::RecorderOptions{size_t(1) << 15, 8});
    {
        storage::WriterOptions wo;
        wo.batch_rows = 700;
        storage::SessionWriter w1(path, wo), w2(path, wo);
        w1.attach(run1, rec1);
        w2.attach(run2, rec2);
        std::thread a([&] {
            std::mt19937_64 rng(test::seed_for("EventBlocks.two.a"));
            for (int k = 0; k < 4; ++k) {
                push_memory(rec1, rng, 1500, 1'000'000 + k * 1500 * 100, label);
                push_spans(rec1, rng, 500, 1'000'000 + k * 500 * 100);
            }
        });
        std::thread b([&] {
            std::mt19937_64 rng(test::seed_for("EventBlocks.two.b"));
            for (int k = 0; k < 4; ++k) push_memory(rec2, rng, 1500, 1'000'000 + k * 1500 * 100, label);
        });
        a.join();
        b.join();
        const auto s1 = w1.detach(run1);
        const auto s2 = w2.detach(run2);
        EXPECT_EQ(s1.lost, 0u) << s1.error;
        EXPECT_EQ(s2.lost, 0u) << s2.error;
    }
    storage::SessionReader r(path);
    for (int64_t run : {run1, run2}) {
        const auto all = r.memory_events(run);
        ASSERT_EQ(all.size(), 6000u) << "run " << run;
        const TimeWindow w{1'000'000 + 1000 * 100, 1'000'000 + 4000 * 100};
        std::vector<int64_t> want, got;
        for (const auto& e : all)
            if (e.t_ns >= w.t0_ns && e.t_ns < w.t1_ns) want.push_back(e.id);
        for (const auto& e : r.memory_events(run, w)) got.push_back(e.id);
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, want) << "run " << run;
    }
    EXPECT_EQ(r.spans(run1).size(), 2000u);
    storage::Db db(path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.query_int("SELECT count(*) FROM memory_events", -1, "t"), db.query_int("SELECT sum(rows) FROM memory_blocks", -2, "t"));
    EXPECT_EQ(db.query_int("SELECT count(*) FROM memory_events e WHERE (SELECT count(*) FROM memory_blocks b WHERE b.run_id = "
                           "e.run_id AND e.id BETWEEN b.first_id AND b.last_id) != 1",
                           -1, "t"),
              0);
}

TEST(EventBlocks, BlocksCoverEveryRowOnceAndHoldTheStateBeforeThem) {
    BlockSession s;
    storage::Db db(s.path, SQLITE_OPEN_READONLY);
    for (const char* table : {"memory_events", "spans"}) {
        const std::string blocks = std::string(table) == "spans" ? "span_blocks" : "memory_blocks";
        EXPECT_EQ(db.query_int(str("SELECT count(*) FROM ", table), -1, "t"),
                  db.query_int(str("SELECT sum(rows) FROM ", blocks), -2, "t"));
        // every row lies in exactly one block of its own run
        EXPECT_EQ(db.query_int(str("SELECT count(*) FROM ", table, " e WHERE (SELECT count(*) FROM ", blocks,
                                   " b WHERE b.run_id = e.run_id AND e.id BETWEEN b.first_id AND b.last_id) != 1"),
                               -1, "t"),
                  0)
            << table;
        EXPECT_LE(db.query_int(str("SELECT max(rows) FROM ", blocks), -1, "t"), storage::kEventBlockRows);
    }
    // The time extents bound their rows.
    EXPECT_EQ(db.query_int("SELECT count(*) FROM memory_events e JOIN memory_blocks b ON b.run_id = e.run_id AND e.id "
                           "BETWEEN b.first_id AND b.last_id WHERE e.t_ns < b.t_min OR e.t_ns > b.t_max",
                           -1, "t"),
              0);
    EXPECT_EQ(db.query_int("SELECT count(*) FROM spans e JOIN span_blocks b ON b.run_id = e.run_id AND e.id "
                           "BETWEEN b.first_id AND b.last_id WHERE e.start_ns < b.start_min OR e.end_ns > b.end_max",
                           -1, "t"),
              0);
    // Each memory block's state is the latest-by-(t, id) fold of its run's earlier rows.
    storage::Stmt blocks = db.prepare("SELECT run_id, first_id, state FROM memory_blocks ORDER BY first_id");
    std::map<int64_t, std::vector<std::array<int64_t, 7>>> rows;  // run -> (id, t, dev, cat, ct, dt)
    storage::Stmt ev = db.prepare("SELECT run_id, id, t_ns, device, category, category_total, device_total FROM memory_events");
    while (ev.step()) rows[ev.i64(0)].push_back({ev.i64(1), ev.i64(2), ev.i64(3), ev.i64(4), ev.i64(5), ev.i64(6), 0});
    int checked = 0;
    while (blocks.step()) {
        const storage::MemoryState got = storage::decode_memory_state(blocks.blob(2), blocks.bytes(2));
        storage::MemoryState want;
        for (const auto& e : rows[blocks.i64(0)])
            if (e[0] < blocks.i64(1)) storage::memory_state_apply(want, int(e[2]), int(e[3]), e[1], e[0], e[4], e[5]);
        EXPECT_EQ(storage::encode_memory_state(got), storage::encode_memory_state(want)) << "block at " << blocks.i64(1);
        ++checked;
    }
    EXPECT_GT(checked, 11);
}

TEST(EventBlocks, SchemaOneFilesAreMigratedToTheSameBlocks) {
    BlockSession s;
    std::vector<MemoryBucket> before;
    std::vector<int64_t> window_before;
    const TimeWindow w{s.t_base + 200'000, s.t_base + 450'000};
    {
        storage::SessionReader r(s.path);
        before = r.memory_timeline(s.run_a, -1, {}, 50);
        for (const auto& e : r.memory_events(s.run_a, w)) window_before.push_back(e.id);
    }
    {  // turn the file back into schema 1: B-tree indexes, no block tables
        storage::Db db(s.path, SQLITE_OPEN_READWRITE);
        db.exec("DROP TABLE span_blocks; DROP TABLE memory_blocks;"
                "CREATE INDEX spans_window ON spans(run_id, dur_class, start_ns);"
                "CREATE INDEX memory_events_time ON memory_events(run_id, t_ns);"
                "PRAGMA user_version=1; UPDATE meta SET value='1' WHERE key='schema_version';",
                "t");
    }
    try {
        storage::SessionReader old(s.path);
        ADD_FAILURE() << "a read-only open of a schema-1 file must ask for the upgrade";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("schema version 1"), std::string::npos) << e.what();
    }
    storage::Session::open(s.path);  // read-write: migrates
    storage::SessionReader r(s.path);
    expect_same_buckets(r.memory_timeline(s.run_a, -1, {}, 50), before, "after migration");
    std::vector<int64_t> window_after;
    for (const auto& e : r.memory_events(s.run_a, w)) window_after.push_back(e.id);
    EXPECT_EQ(window_after, window_before);
    storage::Db db(s.path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.query_int("PRAGMA user_version", 0, "t"), storage::kSchemaVersion);
    EXPECT_EQ(db.query_int("SELECT count(*) FROM sqlite_master WHERE name IN ('spans_window', 'memory_events_time')", -1, "t"), 0);
}

TEST(EventBlocks, StateEncodingRoundTripsAndRejectsMalformedBytes) {
    storage::MemoryState s;
    storage::memory_state_apply(s, -1, 2, 100, 7, 4096, 8192);
    storage::memory_state_apply(s, -1, 2, 90, 9, 1, 1);  // older by time: ignored
    storage::memory_state_apply(s, -1, 2, 100, 8, 5000, 9000);  // same time, higher id: wins
    storage::memory_state_apply(s, 3, 0, 50, 1, 10, 10);
    ASSERT_EQ(s.at(-1).category[2].value, 5000);
    ASSERT_EQ(s.at(-1).total.value, 9000);
    const auto bytes = storage::encode_memory_state(s);
    const auto back = storage::decode_memory_state(bytes.data(), bytes.size());
    EXPECT_EQ(storage::encode_memory_state(back), bytes);
    EXPECT_EQ(back.at(3).category[0].value, 10);
    EXPECT_FALSE(back.at(3).category[1].set);
    EXPECT_TRUE(storage::decode_memory_state(nullptr, 0).empty());
    for (size_t cut : {size_t(2), bytes.size() - 1}) {
        try {
            storage::decode_memory_state(bytes.data(), cut);
            ADD_FAILURE() << "truncated state of " << cut << " bytes accepted";
        } catch (const storage::SessionError& e) {
            EXPECT_EQ(e.kind(), storage::SessionErrorKind::DAMAGED);
        }
    }
    auto bad = bytes;
    bad[8] = 99;  // first entry's category slot
    EXPECT_THROW(storage::decode_memory_state(bad.data(), bad.size()), storage::SessionError);
}

TEST(EventBlocks, BuilderClosesFullBlocksAndRollsBackToTheLastCommit) {
    storage::EventBlockBuilder b;
    for (int64_t i = 1; i <= storage::kEventBlockRows + 5; ++i) b.add_memory(i, 10 * i, -1, 1, i, i);
    std::vector<storage::SpanBlockRow> sb;
    std::vector<storage::MemoryBlockRow> mb;
    b.close(sb, mb);
    ASSERT_EQ(mb.size(), 2u);
    EXPECT_EQ(mb[0].rows, storage::kEventBlockRows);
    EXPECT_EQ(mb[1].first_id, storage::kEventBlockRows + 1);
    EXPECT_EQ(mb[1].rows, 5);
    EXPECT_EQ(storage::decode_memory_state(mb[1].state.data(), mb[1].state.size()).at(-1).total.value,
              storage::kEventBlockRows);
    b.commit();
    b.add_memory(5000, 99999, -1, 1, 123, 456);
    b.add_span(1, 5, 9);
    b.rollback();
    EXPECT_EQ(b.state().at(-1).total.value, storage::kEventBlockRows + 5) << "the failed batch's event is forgotten";
    sb.clear(), mb.clear();
    b.close(sb, mb);
    EXPECT_TRUE(sb.empty());
    EXPECT_TRUE(mb.empty());
}

TEST(EventBlocks, BucketIndexAgreesWithTheReportedEdges) {
    std::mt19937_64 rng(test::seed_for("EventBlocks.buckets"));
    for (int trial = 0; trial < 2000; ++trial) {
        const int64_t t0 = int64_t(rng() % 1'000'000'000'000) - 500'000'000'000;
        const int64_t t1 = t0 + 1 + int64_t(rng() % (trial % 2 ? 1000 : 50'000'000'000));
        const int n = 1 + int(rng() % 2000);
        EXPECT_EQ(storage::bucket_start(t0, t1, n, 0), t0);
        EXPECT_EQ(storage::bucket_start(t0, t1, n, n), t1);
        for (int k = 0; k < 20; ++k) {
            const int64_t t = t0 + int64_t(rng() % uint64_t(t1 - t0));
            const int b = storage::bucket_index(t, t0, t1, n);
            ASSERT_GE(b, 0);
            ASSERT_LT(b, n);
            ASSERT_LE(storage::bucket_start(t0, t1, n, b), t) << t0 << " " << t1 << " " << n;
            ASSERT_GT(storage::bucket_start(t0, t1, n, b + 1), t) << t0 << " " << t1 << " " << n;
        }
    }
}

}  // namespace
}  // namespace kv
