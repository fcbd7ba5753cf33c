// Recorder -> SessionWriter -> SessionReader: every event type round-trips into its table with
// names resolved; readers get only new rows after an id; window queries agree with brute
// force; a concurrent reader only ever sees whole committed batches; drops reach the summary;
// runs sharing one writer stay apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/core/tensor.h"
#include "engine/telemetry/alloc_sink.h"
#include "engine/telemetry/trace.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using storage::Session;
using storage::SessionReader;
using storage::SessionWriter;
using trace::EventType;
using trace::SpanCategory;

struct Fixture {
    test::ScratchDir dir;
    std::string path = dir.file("w.kvlab");
    std::unique_ptr<Session> session = Session::create(path);
    int64_t run = session->create_run("run", R"({"kv_cache":{"name":"h2o-q8","cache_length":512}})");
    Fixture() { session->start_run(run); }
};

// A GPU batch as the CUPTI plugin would deliver it (no GPU here).
void push_fake_gpu_batch(trace::Recorder& rec, uint64_t span_correlation) {
    auto* p = new trace::GpuBatchPayload();
    GpuKernel k{};
    k.start = 1000;
    k.end = 2000;
    k.stream_id = 7;
    k.correlation_id = 42;
    k.demangled_name_id = trace::intern("void attention_kernel<float>(float const*, int)");
    k.short_name_id = trace::intern("attention_kernel<float>");
    k.grid_x = 4;
    k.block_x = 128;
    p->kernels.push_back(k);
    GpuMemcpy c{};
    c.start = 2100;
    c.end = 2200;
    c.stream_id = 7;
    c.correlation_id = 43;
    c.bytes = 4096;
    c.copy_kind = 1;
    p->memcpys.push_back(c);
    GpuMemset s{};
    s.start = 2300;
    s.end = 2350;
    s.bytes = 64;
    p->memsets.push_back(s);
    GpuMemory m{};
    m.start = 900;
    m.address = 0x7000;
    m.bytes = 1 << 20;
    m.memory_operation_type = 1;
    p->memory.push_back(m);
    p->correlations.push_back({span_correlation, 42, 3});
    trace::Event ev;
    ev.gpu = trace::GpuBatchRecord{};
    ev.gpu.type = EventType::GPU_BATCH;
    ev.gpu.payload = p;
    rec.push(ev);
}

TEST(SessionWriter, EveryEventTypeRoundTripsIntoItsTable) {
    Fixture f;
    trace::RecorderOptions ro;
    ro.score_interval = 2;
    trace::Recorder rec(ro);
    MemoryTracker tracker;
    std::vector<float> scores(1 * 2 * 4);
    for (size_t i = 0; i < scores.size(); ++i) scores[i] = float(i) * 0.5f;
    {
        SessionWriter writer(f.path);
        writer.attach(f.run, rec);
        {
            trace::RecorderAllocSink alloc_sink(rec, tracker);
            MemoryTrackerScope ms(tracker);
            trace::RecorderScope scope(rec);
            static const trace::Name kChunk("chunk"), kAttn("attention");
            for (int chunk = 0; chunk < 3; ++chunk) {
                auto c = trace::span(SpanCategory::CHUNK, kChunk, {.chunk = chunk});
                for (int layer = 0; layer < 2; ++layer) {
                    auto a = trace::span(SpanCategory::ATTENTION, kAttn, {.layer = layer, .chunk = chunk});
                    Tensor kv = Tensor::empty({64}, DType::F32, {Device{}, MemCategory::KV_CACHE, "K, \"quoted\""});
                    trace::cache_step(layer, chunk, chunk * 16, 16, std::min(32, (chunk + 1) * 16),
                                      {uint8_t(layer), uint8_t(chunk), 0xAB});
                    trace::scores(layer, chunk, scores.data(), 1, 2, 4);
                }
            }
            trace::cell({.row = 0,
                         .col = 1,
                         .layer_begin = 0,
                         .layer_end = 2,
                         .chunk_begin = 1,
                         .chunk_end = 3,
                         .start_ns = 5,
                         .end_ns = 9,
                         .peak_bytes = 512});
            trace::metric("loss", 3, 1.25);
            trace::metric("accuracy", 3, 0.5);
            trace::log(trace::LogLevel::INFO, "hello, session");
            trace::progress({.tokens_done = 48,
                             .tokens_total = 96,
                             .chunks_done = 3,
                             .chunks_total = 6,
                             .steps_done = 1,
                             .steps_total = 2});
            push_fake_gpu_batch(rec, 777);
        }
        storage::WriterRunStats st = writer.detach(f.run);
        EXPECT_EQ(st.written[size_t(EventType::SPAN)], 9u);
        EXPECT_EQ(st.written[size_t(EventType::ALLOC)], 12u);
        EXPECT_EQ(st.written[size_t(EventType::GPU_BATCH)], 1u);
        EXPECT_EQ(st.lost, 0u);
        EXPECT_EQ(st.error, "");
        EXPECT_EQ(st.recorder.total_dropped(), 0u);
    }
    SessionReader r(f.path);
    auto spans = r.spans(f.run);
    ASSERT_EQ(spans.size(), 9u);
    for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].start_ns, spans[i].start_ns);
    EXPECT_EQ(spans[0].name, "chunk");
    EXPECT_EQ(spans[0].category, SpanCategory::CHUNK);
    EXPECT_EQ(spans[1].name, "attention");
    EXPECT_EQ(spans[1].layer, 0);

    auto mem = r.memory_events(f.run);
    ASSERT_EQ(mem.size(), 12u);
    EXPECT_EQ(mem[0].bytes, 256);
    EXPECT_EQ(mem[0].label, "K, \"quoted\"");
    EXPECT_EQ(mem[0].category, MemCategory::KV_CACHE);
    EXPECT_EQ(mem[0].layer, 0);
    EXPECT_EQ(mem[0].chunk, 0);
    EXPECT_EQ(mem[1].bytes, -256);
    EXPECT_EQ(mem[1].alloc_id, mem[0].alloc_id);

    auto steps1 = r.cache_steps(f.run, 1);
    ASSERT_EQ(steps1.size(), 3u);
    for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(steps1[size_t(c)].layer, 1);
        EXPECT_EQ(steps1[size_t(c)].chunk, c);
        EXPECT_EQ(steps1[size_t(c)].input_pos, c * 16);
        EXPECT_EQ(steps1[size_t(c)].replay_log, (std::vector<uint8_t>{1, uint8_t(c), 0xAB}));
    }
    EXPECT_EQ(r.cache_steps(f.run, -1).size(), 6u);

    auto sc = r.score_snapshots(f.run, 0);
    ASSERT_EQ(sc.size(), 3u);
    EXPECT_TRUE(sc[0].has_values);
    EXPECT_EQ(sc[0].values, scores);
    EXPECT_FALSE(sc[1].has_values);  // interval 2: chunk 1 keeps only the summary
    EXPECT_TRUE(sc[1].values.empty());
    EXPECT_EQ(sc[1].stats.max, 3.5f);
    EXPECT_EQ(sc[1].stats.count, 8);
    EXPECT_TRUE(sc[2].has_values);
    auto sc_nov = r.score_snapshots(f.run, 0, 0, /*with_values=*/false);
    EXPECT_TRUE(sc_nov[0].has_values);
    EXPECT_TRUE(sc_nov[0].values.empty());

    auto cells = r.cells(f.run);
    ASSERT_EQ(cells.size(), 1u);
    EXPECT_EQ(cells[0].col, 1);
    EXPECT_EQ(cells[0].chunk_end, 3);
    EXPECT_EQ(cells[0].peak_bytes, 512);

    EXPECT_EQ(r.metric_names(f.run), (std::vector<std::string>{"accuracy", "loss"}));
    auto loss = r.metrics(f.run, "loss");
    ASSERT_EQ(loss.size(), 1u);
    EXPECT_EQ(loss[0].step, 3);
    EXPECT_EQ(loss[0].value, 1.25);
    auto logs = r.logs(f.run);
    ASSERT_EQ(logs.size(), 1u);
    EXPECT_EQ(logs[0].text, "hello, session");
    EXPECT_EQ(logs[0].level, "info");

    auto gpu = r.gpu_activity(f.run);
    ASSERT_EQ(gpu.size(), 3u);
    EXPECT_EQ(gpu[0].name, "attention_kernel<float>");
    EXPECT_EQ(gpu[0].external_id, 777);
    EXPECT_EQ(gpu[0].stream, 7);
    EXPECT_EQ(gpu[1].name, "memcpy HtoD");
    EXPECT_EQ(gpu[1].bytes, 4096);
    EXPECT_EQ(gpu[2].name, "memset");
    EXPECT_EQ(r.count_rows("CUDA_GPU_MEMORY_USAGE_EVENTS", f.run), 1);
    EXPECT_EQ(r.count_rows("CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION", f.run), 1);

    storage::RunInfo info = r.run(f.run);
    EXPECT_EQ(info.progress.tokens_done, 48);
    EXPECT_EQ(info.progress.steps_total, 2);
    auto summary = nlohmann::json::parse(info.summary);
    EXPECT_EQ(summary["events_written"]["span"], 9);
    EXPECT_EQ(summary["events_written"]["alloc"], 12);
    EXPECT_EQ(summary["dropped_total"], 0);
    EXPECT_EQ(summary["peak_bytes"]["cpu"], 256);
    EXPECT_EQ(summary["peak_bytes_by_category"]["cpu"]["kv_cache"], 256);
    EXPECT_TRUE(summary.contains("tokens_per_s"));

    // nsys-style SQL recipes work on the CUPTI tables.
    storage::Db db(f.path, SQLITE_OPEN_READONLY);
    EXPECT_EQ(db.query_text("SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName",
                            "", "test"),
              "attention_kernel<float>");
    EXPECT_EQ(db.query_int("SELECT k.\"end\" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k", 0, "test"), 1000);
}

TEST(SessionWriter, ReadersGetOnlyRowsNewerThanTheLastId) {
    Fixture f;
    trace::Recorder rec;
    SessionWriter writer(f.path);
    writer.attach(f.run, rec);
    SessionReader r(f.path);
    static const trace::Name kName("step");
    auto record = [&](int from, int to) {
        trace::RecorderScope scope(rec);
        for (int i = from; i < to; ++i) {
            trace::SpanScope s(SpanCategory::OTHER, kName, {.chunk = i});
            trace::metric("i", i, i);
            trace::log(trace::LogLevel::DEBUG, std::to_string(i));
        }
    };
    record(0, 100);
    writer.flush();
    auto spans = r.spans(f.run);
    auto metrics = r.metrics(f.run);
    auto logs = r.logs(f.run);
    ASSERT_EQ(spans.size(), 100u);
    ASSERT_EQ(metrics.size(), 100u);
    ASSERT_EQ(logs.size(), 100u);
    record(100, 130);
    writer.flush();
    auto new_spans = r.spans(f.run, {}, spans.back().id);
    ASSERT_EQ(new_spans.size(), 30u);
    EXPECT_EQ(new_spans.front().chunk, 100);
    EXPECT_EQ(r.metrics(f.run, "", metrics.back().id).size(), 30u);
    EXPECT_EQ(r.logs(f.run, logs.back().id).size(), 30u);
    EXPECT_EQ(r.spans(f.run, {}, new_spans.back().id).size(), 0u);
    EXPECT_EQ(r.spans(f.run, {}, 0, 10).size(), 10u);  // limit
    writer.detach(f.run);
}

TEST(SessionWriter, SpanWindowQueryMatchesBruteForce) {
    Fixture f;
    trace::Recorder rec(trace::RecorderOptions{size_t(1) << 16, 8});
    std::mt19937_64 rng(test::seed_for("SpanWindow"));
    static const trace::Name kName("w");
    const uint64_t base = 1'000'000'000;
    {
        SessionWriter writer(f.path);
        writer.attach(f.run, rec);
        trace::RecorderScope scope(rec);
        trace::span_complete(SpanCategory::RUN, kName, base, base + 50'000'000);  // one very long span
        std::uniform_int_distribution<uint64_t> start(0, 40'000'000);
        for (int i = 0; i < 5000; ++i) {
            uint64_t s = base + start(rng);
            int shape = i % 4;
            uint64_t d = shape == 0   ? 0
                         : shape == 1 ? rng() % 1000
                         : shape == 2 ? rng() % 1'000'000
                                      : rng() % 10'000'000;
            trace::span_complete(SpanCategory::OTHER, kName, s, s + d, {.chunk = i});
        }
        writer.detach(f.run);
    }
    SessionReader r(f.path);
    auto all = r.spans(f.run);
    ASSERT_EQ(all.size(), 5001u);
    std::uniform_int_distribution<int64_t> t(int64_t(base) - 1'000'000, int64_t(base) + 60'000'000);
    for (int q = 0; q < 40; ++q) {
        int64_t a = t(rng), b = a + (q % 5 == 0 ? 1 : int64_t(rng() % 5'000'000) + 1);
        std::vector<int64_t> expect, got;
        for (const auto& s : all)
            if ((s.end_ns > a && s.start_ns < b) || (s.start_ns == s.end_ns && s.start_ns >= a && s.start_ns < b))
                expect.push_back(s.id);
        for (const auto& s : r.spans(f.run, {a, b})) got.push_back(s.id);
        std::sort(expect.begin(), expect.end());
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, expect) << "window [" << a << ", " << b << ")";
    }
}

TEST(SessionWriter, MemoryWindowAndDecimatedTimelineAgreeWithTheEvents) {
    Fixture f;
    trace::Recorder rec;
    MemoryTracker tracker;
    {
        SessionWriter writer(f.path);
        writer.attach(f.run, rec);
        trace::RecorderAllocSink sink(rec, tracker);
        MemoryTrackerScope ms(tracker);
        std::vector<Tensor> live;
        for (int i = 0; i < 400; ++i) {
            MemCategory c = MemCategory(i % 3 == 0 ? 1 : i % 3 == 1 ? 4 : 5);
            live.push_back(Tensor::empty({64 + i}, DType::F32, {Device{}, c, "t"}));
            if (i % 5 == 4) live.erase(live.begin(), live.begin() + 3);
        }
        live.clear();
        writer.detach(f.run);
    }
    SessionReader r(f.path);
    auto all = r.memory_events(f.run);
    ASSERT_GT(all.size(), 400u);
    int64_t t0 = all.front().t_ns, t1 = all.back().t_ns + 1;
    int64_t mid = t0 + (t1 - t0) / 3, end = t0 + 2 * (t1 - t0) / 3;
    size_t in_window = 0;
    for (const auto& e : all) in_window += e.t_ns >= mid && e.t_ns < end;
    auto win = r.memory_events(f.run, {mid, end});
    EXPECT_EQ(win.size(), in_window);
    for (size_t i = 1; i < win.size(); ++i) EXPECT_LE(win[i - 1].t_ns, win[i].t_ns);

    EXPECT_EQ(r.memory_devices(f.run), std::vector<int>{-1});
    auto buckets = r.memory_timeline(f.run, -1, {}, 16);
    ASSERT_EQ(buckets.size(), 16u);
    int64_t peak = 0, events = 0;
    for (const auto& e : all) peak = std::max(peak, e.device_total);
    int64_t bucket_peak = 0;
    for (const auto& b : buckets) {
        bucket_peak = std::max(bucket_peak, b.total_max);
        events += b.events;
        int64_t sum = 0;
        for (int64_t v : b.at_max) sum += v;
        EXPECT_EQ(sum, b.total_max) << "categories at the bucket maximum add up to the device total";
        EXPECT_LE(b.total_min, b.total_max);
    }
    EXPECT_EQ(bucket_peak, peak);
    EXPECT_EQ(events, int64_t(all.size()));
    EXPECT_EQ(buckets.back().total_last, 0);
}

TEST(SessionWriter, ConcurrentReaderOnlySeesWholeCommittedBatches) {
    Fixture f;
    trace::Recorder rec;
    storage::WriterOptions wo;
    wo.batch_rows = 500;
    wo.commit_interval_ms = 5;
    SessionWriter writer(f.path, wo);
    writer.attach(f.run, rec);
    std::atomic<bool> done{false};
    constexpr int kSteps = 60000;
    std::thread producer([&] {
        trace::RecorderScope scope(rec);
        static const trace::Name kLoss("loss");
        for (int i = 0; i < kSteps; ++i) {
            // Metric i and span i are pushed together; a reader must never see one without the
            // other once both are committed (same thread, same queue, same or later batch).
            trace::metric(kLoss, i, double(i));
            while (rec.stats().pending > 20000) std::this_thread::yield();
        }
        done = true;
    });
    int polls = 0, errors = 0;
    size_t last = 0;
    {
        SessionReader r(f.path);
        while (!done || last < size_t(kSteps)) {
            try {
                auto m = r.metrics(f.run, "loss");
                // Committed data is a prefix 0..k-1 of what was produced: no holes, no reordering.
                for (size_t i = 0; i < m.size(); ++i)
                    if (m[i].step != int64_t(i)) {
                        ADD_FAILURE() << "row " << i << " has step " << m[i].step;
                        break;
                    }
                EXPECT_GE(m.size(), last);
                last = m.size();
            } catch (const std::exception& e) {
                ++errors;
                ADD_FAILURE() << e.what();
            }
            ++polls;
            if (done && last < size_t(kSteps)) writer.flush();
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            if (polls > 20000) break;
        }
    }
    producer.join();
    writer.detach(f.run);
    EXPECT_EQ(errors, 0);
    EXPECT_EQ(last, size_t(kSteps));
    EXPECT_GT(polls, 5);
    std::printf("[ info ] %d reader polls while writing, %llu commits\n", polls,
                (unsigned long long)writer.stats().commits);
}

TEST(SessionWriter, QueueOverflowReachesTheRunSummary) {
    Fixture f;
    trace::RecorderOptions ro;
    ro.queue_capacity = 16;
    trace::Recorder rec(ro);
    storage::WriterRunStats st;
    uint64_t attempts = 0;
    {
        SessionWriter writer(f.path);
        writer.attach(f.run, rec);
        trace::RecorderScope scope(rec);
        static const trace::Name kName("flood");
        for (int i = 0; i < 200000; ++i, ++attempts) trace::SpanScope s(SpanCategory::OTHER, kName);
        st = writer.detach(f.run);
    }
    const uint64_t dropped = st.recorder.dropped[size_t(EventType::SPAN)];
    EXPECT_GT(dropped, 0u) << "a 16-event queue cannot keep up with a tight loop";
    EXPECT_EQ(st.written[size_t(EventType::SPAN)] + dropped, attempts);
    SessionReader r(f.path);
    EXPECT_EQ(uint64_t(r.count_rows("spans", f.run)), st.written[size_t(EventType::SPAN)]);
    auto summary = nlohmann::json::parse(r.run(f.run).summary);
    EXPECT_EQ(summary["dropped_total"].get<uint64_t>(), dropped);
    EXPECT_EQ(summary["events_dropped"]["span"].get<uint64_t>(), dropped);
}

TEST(SessionWriter, RunsSharingAWriterStayApartAndAttachErrorsAreNamed) {
    Fixture f;
    int64_t run2 = f.session->create_run("second");
    f.session->start_run(run2);
    trace::Recorder a, b;
    SessionWriter writer(f.path);
    writer.attach(f.run, a);
    writer.attach(run2, b);
    static const trace::Name kName("x");
    std::thread ta([&] {
        trace::RecorderScope s(a);
        for (int i = 0; i < 300; ++i) trace::SpanScope sp(SpanCategory::OTHER, kName);
    });
    std::thread tb([&] {
        trace::RecorderScope s(b);
        for (int i = 0; i < 200; ++i) trace::SpanScope sp(SpanCategory::OTHER, kName);
    });
    ta.join();
    tb.join();
    try {
        writer.attach(f.run, b);
        ADD_FAILURE() << "attached a run twice";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("already attached"), std::string::npos) << e.what();
    }
    try {
        writer.attach(12345, b);
        ADD_FAILURE() << "attached an unknown run";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("has no run 12345"), std::string::npos) << e.what();
    }
    writer.detach(f.run);
    writer.detach(run2);
    try {
        writer.detach(run2);
        ADD_FAILURE() << "detached twice";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("not attached"), std::string::npos) << e.what();
    }
    SessionReader r(f.path);
    EXPECT_EQ(r.count_rows("spans", f.run), 300);
    EXPECT_EQ(r.count_rows("spans", run2), 200);
}

}  // namespace
}  // namespace kv
