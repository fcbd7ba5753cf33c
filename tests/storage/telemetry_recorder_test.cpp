// Telemetry event model and Recorder: record layout, no-op without a recorder, span nesting and
// context, allocator events, score intervals and statistics, payload hand-over, per-thread
// queues and drop counting on overflow (never blocking).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/telemetry/alloc_sink.h"
#include "engine/telemetry/score_stats.h"
#include "engine/telemetry/trace.h"
#include "storage_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

using trace::Event;
using trace::EventType;
using trace::SpanCategory;

TEST(EventModel, RecordsAreOneCacheLineAndNamesCoverEveryEnum) {
    EXPECT_EQ(sizeof(Event), 64u);
    for (size_t t = 0; t < trace::kNumEventTypes; ++t) {
        EXPECT_STRNE(trace::event_type_name(EventType(t)), "unknown") << t;
        EXPECT_LE(trace::kEventRecordSize[t], sizeof(Event));
    }
    for (size_t c = 0; c < trace::kNumSpanCategories; ++c) {
        std::string name = trace::span_category_name(SpanCategory(c));
        EXPECT_EQ(trace::span_category_from_name(name), SpanCategory(c));
    }
    EXPECT_STREQ(trace::span_category_name(SpanCategory::CHECKPOINT_COPY), "checkpoint_copy");
    EXPECT_STREQ(trace::event_type_name(EventType::COUNT), "unknown");
    try {
        trace::span_category_from_name("attn");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown span category 'attn'"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("attention"), std::string::npos);
    }
    EXPECT_EQ(trace::device_code(Device{DeviceType::CUDA, 3}), 3);
    EXPECT_EQ(trace::device_code(Device{}), -1);
    EXPECT_EQ(trace::device_code_name(-1), "cpu");
    EXPECT_EQ(trace::device_code_name(2), "cuda:2");
}

TEST(StringTable, InternIsStableAndThreadSafe) {
    uint32_t a = trace::intern("attention");
    EXPECT_EQ(trace::intern("attention"), a);
    EXPECT_EQ(trace::interned(a), "attention");
    EXPECT_EQ(trace::intern(""), 0u);
    EXPECT_EQ(trace::interned(0), "");
    EXPECT_EQ(trace::interned(0xFFFFFFF0u), "");
    std::vector<std::thread> th;
    std::vector<uint32_t> ids(8);
    for (int i = 0; i < 8; ++i)
        th.emplace_back([&, i] { ids[size_t(i)] = trace::intern("same name from many threads"); });
    for (auto& t : th) t.join();
    for (uint32_t id : ids) EXPECT_EQ(id, ids[0]);
}

TEST(Recorder, EverythingIsANoOpWithoutARecorder) {
    ASSERT_FALSE(trace::active());
    static const trace::Name kName("unused");
    {
        auto s = trace::span(SpanCategory::ATTENTION, kName, {.layer = 1});
        EXPECT_EQ(s.correlation_id(), 0u);
    }
    trace::metric("loss", 1, 2.0);
    trace::log(trace::LogLevel::INFO, "nobody listens");
    std::vector<float> v(16, 1.0f);
    trace::scores(0, 0, v.data(), 1, 2, 8);
    trace::cache_step(0, 0, 0, 4, 4, {1, 2, 3});
    trace::cell({});
    trace::progress({});
    EXPECT_FALSE(trace::wants_full_scores(0));
    EXPECT_EQ(trace::current(), nullptr);
}

TEST(Recorder, SpansNestAndCarryTheirFields) {
    trace::Recorder rec;
    {
        trace::RecorderScope scope(rec);
        static const trace::Name kLayer("layer"), kAttn("attention");
        auto outer = trace::span(SpanCategory::LAYER, kLayer, {.layer = 3, .chunk = 5, .cell_row = 1, .cell_col = 2});
        { KV_TRACE_SPAN(SpanCategory::ATTENTION, "attention", .layer = 3, .chunk = 5, .stream = 2); }
        auto x =
            trace::span(SpanCategory::MLP, std::string_view("mlp dynamic"), {.device = Device{DeviceType::CUDA, 1}});
    }
    test::CollectingSink sink;
    EXPECT_EQ(rec.drain(sink), 3u);
    auto spans = sink.of(EventType::SPAN);
    ASSERT_EQ(spans.size(), 3u);
    // Push order = end order: the attention span ends first, then mlp, then the layer.
    const auto& attn = spans[0].span;
    const auto& mlp = spans[1].span;
    const auto& layer = spans[2].span;
    EXPECT_EQ(trace::interned(attn.name_id), "attention");
    EXPECT_EQ(attn.category, SpanCategory::ATTENTION);
    EXPECT_EQ(attn.layer, 3);
    EXPECT_EQ(attn.chunk, 5);
    EXPECT_EQ(attn.cell_row, -1);
    EXPECT_EQ(attn.stream, 2);
    EXPECT_EQ(attn.device, -1);
    EXPECT_EQ(trace::interned(mlp.name_id), "mlp dynamic");
    EXPECT_EQ(mlp.device, 1);
    EXPECT_EQ(layer.cell_row, 1);
    EXPECT_EQ(layer.cell_col, 2);
    EXPECT_LE(layer.start_ns, attn.start_ns);
    EXPECT_LE(attn.start_ns, attn.end_ns);
    EXPECT_LE(attn.end_ns, layer.end_ns);
    EXPECT_EQ(attn.thread, layer.thread);
    EXPECT_EQ(attn.thread, trace::thread_index());
    EXPECT_EQ(attn.correlation_id, 0u);  // no GPU tracer
}

TEST(Recorder, ScopesNestAndRestore) {
    trace::Recorder a, b;
    static const trace::Name kName("x");
    {
        trace::RecorderScope sa(a);
        { trace::SpanScope s(SpanCategory::OTHER, kName); }
        {
            trace::RecorderScope sb(b);
            EXPECT_EQ(trace::current(), &b);
            { trace::SpanScope s(SpanCategory::OTHER, kName); }
            { trace::SpanScope s(SpanCategory::OTHER, kName); }
        }
        EXPECT_EQ(trace::current(), &a);
    }
    EXPECT_EQ(trace::current(), nullptr);
    EXPECT_EQ(a.stats().pushed[size_t(EventType::SPAN)], 1u);
    EXPECT_EQ(b.stats().pushed[size_t(EventType::SPAN)], 2u);
}

TEST(Recorder, AllocationsBecomeRecordsStampedWithTheEnclosingSpan) {
    MemoryTracker tracker;
    MemoryTrackerScope ms(tracker);
    Tensor before = Tensor::empty({256}, DType::F32, {Device{}, MemCategory::WEIGHTS, "wte"});  // 1 KiB
    trace::Recorder rec;
    {
        trace::RecorderAllocSink sink(rec, tracker);
        trace::RecorderScope scope(rec);
        static const trace::Name kName("cache update");
        {
            auto s = trace::span(SpanCategory::CACHE_UPDATE, kName, {.layer = 3, .chunk = 5});
            Tensor k = Tensor::empty({1000}, DType::F32, {Device{}, MemCategory::KV_CACHE, "layer 3 K"});
        }
        Tensor outside = Tensor::empty({10}, DType::F32, {Device{}, MemCategory::ACTIVATIONS, "tmp"});
    }
    test::CollectingSink sink;
    rec.drain(sink);
    auto allocs = sink.of(EventType::ALLOC);
    ASSERT_EQ(allocs.size(), 5u);  // baseline (weights), alloc+free K, alloc+free tmp
    const auto& base = allocs[0].alloc;
    EXPECT_EQ(base.flags, trace::ALLOC_FLAGS_BASELINE);
    EXPECT_EQ(base.category, MemCategory::WEIGHTS);
    EXPECT_EQ(base.bytes, 0);
    EXPECT_EQ(base.category_total, 1024);
    EXPECT_EQ(base.device_total, 1024);
    const auto& k = allocs[1].alloc;
    EXPECT_EQ(k.bytes, 4000);
    EXPECT_EQ(k.category, MemCategory::KV_CACHE);
    EXPECT_EQ(trace::interned(k.label_id), "layer 3 K");
    EXPECT_EQ(k.layer, 3);
    EXPECT_EQ(k.chunk, 5);
    EXPECT_EQ(k.category_total, 4000);
    EXPECT_EQ(k.device_total, 5024);
    EXPECT_NE(k.address, 0u);
    const auto& kfree = allocs[2].alloc;
    EXPECT_EQ(kfree.bytes, -4000);
    EXPECT_EQ(kfree.alloc_id, k.alloc_id);
    EXPECT_EQ(kfree.device_total, 1024);
    const auto& tmp = allocs[3].alloc;
    EXPECT_EQ(tmp.layer, -1);  // the span's context was restored when it ended
    EXPECT_EQ(tmp.chunk, -1);
    // The sink detached: later allocations are not recorded.
    Tensor after = Tensor::empty({10}, DType::F32, {Device{}, MemCategory::ACTIVATIONS, "after"});
    test::CollectingSink more;
    EXPECT_EQ(rec.drain(more), 0u);
}

TEST(ScoreStats, MatchSortedReferenceAndSkipNonFinite) {
    std::mt19937_64 rng(test::seed_for("ScoreStats"));
    std::uniform_real_distribution<float> u(-3.0f, 7.0f);
    for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(4097)}) {
        std::vector<float> v(n);
        for (auto& x : v) x = u(rng);
        std::vector<float> with_nan = v;
        with_nan.push_back(NAN);
        with_nan.push_back(INFINITY);
        trace::ScoreStats s = trace::score_stats(with_nan.data(), with_nan.size());
        std::vector<float> sorted = v;
        std::sort(sorted.begin(), sorted.end());
        double sum = 0, sum2 = 0;
        for (float x : v) sum += x, sum2 += double(x) * x;
        double mean = sum / double(n);
        EXPECT_EQ(s.count, int64_t(n));
        EXPECT_EQ(s.nonfinite, 2);
        EXPECT_EQ(s.min, sorted.front());
        EXPECT_EQ(s.max, sorted.back());
        EXPECT_NEAR(s.mean, mean, 1e-5);
        EXPECT_NEAR(s.stddev, std::sqrt(std::max(0.0, sum2 / double(n) - mean * mean)), 1e-4);
        auto q = [&](double p) { return sorted[size_t(p * double(n - 1))]; };
        EXPECT_EQ(s.p10, q(0.10)) << n;
        EXPECT_EQ(s.p50, q(0.50)) << n;
        EXPECT_EQ(s.p90, q(0.90)) << n;
        EXPECT_EQ(s.p99, q(0.99)) << n;
    }
    trace::ScoreStats none = trace::score_stats(nullptr, 0);
    EXPECT_EQ(none.count, 0);
}

TEST(Recorder, ScoreSummariesEveryChunkFullArraysEveryInterval) {
    trace::RecorderOptions opt;
    opt.score_interval = 4;
    trace::Recorder rec(opt);
    std::vector<float> v(2 * 3 * 5);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
    {
        trace::RecorderScope scope(rec);
        for (int chunk = 0; chunk <= 8; ++chunk) {
            EXPECT_EQ(trace::wants_full_scores(chunk), chunk % 4 == 0);
            trace::scores(2, chunk, v.data(), 2, 3, 5, /*pass=*/1);
        }
    }
    test::CollectingSink sink;
    rec.drain(sink);
    auto recs = sink.of(EventType::SCORES);
    ASSERT_EQ(recs.size(), 9u);
    ASSERT_EQ(sink.scores.size(), 9u);
    for (int chunk = 0; chunk <= 8; ++chunk) {
        const auto& r = recs[size_t(chunk)].scores;
        const auto& p = sink.scores[size_t(chunk)];
        EXPECT_EQ(r.layer, 2);
        EXPECT_EQ(r.chunk, chunk);
        EXPECT_EQ(r.pass, 1);
        EXPECT_EQ(p.B, 2);
        EXPECT_EQ(p.G, 3);
        EXPECT_EQ(p.T, 5);
        EXPECT_EQ(p.stats.count, 30);
        EXPECT_EQ(p.stats.max, 29.0f);
        EXPECT_EQ(bool(r.full), chunk % 4 == 0);
        if (chunk % 4 == 0) {
            EXPECT_EQ(p.values, v);
        } else {
            EXPECT_TRUE(p.values.empty());
        }
    }
    EXPECT_EQ(trace::default_score_interval(true), 1);
    EXPECT_EQ(trace::default_score_interval(false), 8);
}

TEST(Recorder, CacheStepsLogsMetricsProgressAndCellsArriveIntact) {
    trace::Recorder rec;
    {
        trace::RecorderScope scope(rec);
        trace::cache_step(4, 7, 1024, 16, 512, {9, 8, 7, 6});
        trace::log(trace::LogLevel::WARNING, "evicted 3 tokens");
        trace::metric("loss", 12, 2.5);
        trace::progress({.tokens_done = 100, .tokens_total = 400, .chunks_done = 2, .chunks_total = 8});
        trace::cell({.row = 1,
                     .col = 2,
                     .layer_begin = 0,
                     .layer_end = 4,
                     .chunk_begin = 2,
                     .chunk_end = 4,
                     .start_ns = 10,
                     .end_ns = 20,
                     .peak_bytes = 4096});
    }
    test::CollectingSink sink;
    EXPECT_EQ(rec.drain(sink), 5u);
    ASSERT_EQ(sink.replay_logs.size(), 1u);
    EXPECT_EQ(sink.replay_logs[0], (std::vector<uint8_t>{9, 8, 7, 6}));
    auto cs = sink.of(EventType::CACHE_STEP)[0].cache_step;
    EXPECT_EQ(cs.layer, 4);
    EXPECT_EQ(cs.chunk, 7);
    EXPECT_EQ(cs.input_pos, 1024);
    EXPECT_EQ(cs.num_tokens, 16);
    EXPECT_EQ(cs.cache_length, 512);
    ASSERT_EQ(sink.logs.size(), 1u);
    EXPECT_EQ(sink.logs[0], "evicted 3 tokens");
    auto m = sink.of(EventType::METRIC)[0].metric;
    EXPECT_EQ(trace::interned(m.name_id), "loss");
    EXPECT_EQ(m.step, 12);
    EXPECT_EQ(m.value, 2.5);
    auto p = sink.of(EventType::PROGRESS)[0].progress;
    EXPECT_EQ(p.tokens_done, 100);
    EXPECT_EQ(p.chunks_total, 8);
    auto c = sink.of(EventType::CELL)[0].cell;
    EXPECT_EQ(c.row, 1);
    EXPECT_EQ(c.layer_end, 4);
    EXPECT_EQ(c.peak_bytes, 4096);
}

TEST(Recorder, FullQueueCountsDropsInsteadOfBlocking) {
    trace::RecorderOptions opt;
    opt.queue_capacity = 16;
    trace::Recorder rec(opt);
    const auto t = std::chrono::steady_clock::now();
    {
        trace::RecorderScope scope(rec);
        static const trace::Name kName("flood");
        for (int i = 0; i < 100000; ++i) trace::SpanScope s(SpanCategory::OTHER, kName);
        for (int i = 0; i < 100; ++i)
            trace::cache_step(0, i, 0, 1, 1, std::vector<uint8_t>(1000, 1));  // payloads freed
    }
    // Generous bound: the point is that nothing waits for a consumer that never comes.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 5.0);
    trace::RecorderStats s = rec.stats();
    EXPECT_EQ(s.pushed[size_t(EventType::SPAN)], 16u);
    EXPECT_EQ(s.dropped[size_t(EventType::SPAN)], 100000u - 16u);
    EXPECT_EQ(s.dropped[size_t(EventType::CACHE_STEP)], 100u);
    EXPECT_EQ(s.total_dropped(), 100000u - 16u + 100u);
    EXPECT_EQ(s.pending, 16u);
    test::CollectingSink sink;
    EXPECT_EQ(rec.drain(sink), 16u);
    EXPECT_EQ(rec.stats().pending, 0u);
}

TEST(Recorder, EachThreadHasItsOwnOrderedQueueWhileAConsumerDrains) {
    trace::RecorderOptions opt;
    opt.queue_capacity = 1 << 10;
    trace::Recorder rec(opt);
    constexpr int kThreads = 4, kPerThread = 20000;
    std::atomic<int> running{kThreads};
    std::vector<std::thread> producers;
    for (int t = 0; t < kThreads; ++t)
        producers.emplace_back([&, t] {
            trace::RecorderScope scope(rec);
            for (int i = 0; i < kPerThread; ++i) {
                // Retry instead of dropping so the test can check completeness and order.
                Event ev;
                ev.metric = trace::MetricRecord{};
                ev.metric.type = EventType::METRIC;
                ev.metric.step = i;
                ev.metric.value = t;
                while (!rec.push(ev)) std::this_thread::yield();
            }
            running.fetch_sub(1);
        });
    test::CollectingSink sink;
    while (running.load() > 0) rec.drain(sink);
    for (auto& p : producers) p.join();
    rec.drain(sink);
    ASSERT_EQ(sink.events.size(), size_t(kThreads * kPerThread));
    std::vector<int64_t> next(kThreads, 0);
    for (const auto& e : sink.events) {
        int t = int(e.metric.value);
        EXPECT_EQ(e.metric.step, next[size_t(t)]) << "thread " << t;
        next[size_t(t)] = e.metric.step + 1;
    }
    trace::RecorderStats s = rec.stats();
    EXPECT_EQ(s.queues, size_t(kThreads));
    EXPECT_EQ(s.pushed[size_t(EventType::METRIC)], uint64_t(kThreads * kPerThread));
}

}  // namespace
}  // namespace kv
