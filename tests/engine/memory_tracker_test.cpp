// Tracked allocator: balance, peaks per (device, category), sink events, budget refusal.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/core/tensor.h"
#include "engine/memory/memory_tracker.h"

#include <chrono>
#include <thread>

namespace kv {
namespace {

struct RecordingSink : AllocSink {
    std::vector<AllocEvent> events;
    std::vector<std::string> labels;
    void on_alloc_event(const AllocEvent& ev) override {
        events.push_back(ev);
        labels.push_back(ev.label ? *ev.label : "");
    }
};

const Device kCpu{};

TEST(MemoryTracker, AllocFreeBalanceAndPeaks) {
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    {
        Tensor a = Tensor::empty({1000}, DType::F32, {kCpu, MemCategory::KV_CACHE, "layer 0 keys"});
        Tensor b = Tensor::empty({250}, DType::F64, {kCpu, MemCategory::WEIGHTS, "wte"});
        EXPECT_EQ(tr.current(kCpu, MemCategory::KV_CACHE), 4000);
        EXPECT_EQ(tr.current(kCpu, MemCategory::WEIGHTS), 2000);
        EXPECT_EQ(tr.current_total(kCpu), 6000);
        Tensor view = a.slice(0, 10, 20);  // views never allocate
        EXPECT_EQ(tr.current_total(kCpu), 6000);
        {
            Tensor c = Tensor::empty({100}, DType::BF16, {kCpu, MemCategory::KV_CACHE, "tmp"});
            EXPECT_EQ(tr.current(kCpu, MemCategory::KV_CACHE), 4200);
        }
        EXPECT_EQ(tr.current(kCpu, MemCategory::KV_CACHE), 4000);
        EXPECT_EQ(tr.peak(kCpu, MemCategory::KV_CACHE), 4200);
        EXPECT_EQ(tr.peak_total(kCpu), 6200);
    }
    EXPECT_EQ(tr.current_total(kCpu), 0);
    for (size_t c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(tr.current(kCpu, MemCategory(c)), 0);
    EXPECT_EQ(tr.peak_total(kCpu), 6200);
    tr.reset_peaks();
    EXPECT_EQ(tr.peak_total(kCpu), 0);
}

TEST(MemoryTracker, SinkSeesEveryAllocAndFreeWithRunningTotals) {
    MemoryTracker tr;
    RecordingSink sink;
    tr.add_sink(&sink);
    MemoryTrackerScope scope(tr);
    {
        Tensor a = Tensor::empty({16}, DType::F32, {kCpu, MemCategory::ACTIVATIONS, "x"});
        Tensor b = Tensor::empty({8}, DType::F32, {kCpu, MemCategory::GRADIENTS, "dx"});
    }
    ASSERT_EQ(sink.events.size(), 4u);
    EXPECT_EQ(sink.events[0].bytes, 64);
    EXPECT_EQ(sink.events[0].category, MemCategory::ACTIVATIONS);
    EXPECT_EQ(sink.labels[0], "x");
    EXPECT_EQ(sink.events[1].device_total, 96);
    EXPECT_EQ(sink.events[1].category_total, 32);
    // Frees in reverse order of construction, with negative sizes and matching ids.
    EXPECT_EQ(sink.events[2].bytes, -32);
    EXPECT_EQ(sink.events[2].id, sink.events[1].id);
    EXPECT_EQ(sink.events[3].bytes, -64);
    EXPECT_EQ(sink.events[3].device_total, 0);
    int64_t sum = 0;
    for (const auto& e : sink.events) sum += e.bytes;
    EXPECT_EQ(sum, 0);
    for (size_t i = 1; i < sink.events.size(); ++i) EXPECT_GE(sink.events[i].t_ns, sink.events[i - 1].t_ns);
    tr.remove_sink(&sink);
}

TEST(MemoryTracker, InstrumentationIsCountedApartFromTheRunsOwnMemory) {
    // Timeline: run 4000 B; shadow (kv_fidelity) 1000 B; in a scope 2000 B of activations (freed
    // after the scope closed: still instrumentation); run 500 B more. Own peak: 4500 B (the run's
    // allocations alone at their highest); total peak 4000 + 1000 + 2000 = 7000 B.
    MemoryTracker tr;
    RecordingSink sink;
    tr.add_sink(&sink);
    MemoryTrackerScope scope(tr);
    Tensor run = Tensor::empty({1000}, DType::F32, {kCpu, MemCategory::KV_CACHE, "cache"});
    Tensor shadow = Tensor::empty({250}, DType::F32, {kCpu, MemCategory::KV_FIDELITY, "shadow"});
    Tensor measured;
    {
        InstrumentationScope instr;
        EXPECT_TRUE(InstrumentationScope::active());
        measured = Tensor::empty({500}, DType::F32, {kCpu, MemCategory::ACTIVATIONS, "dense reference"});
    }
    EXPECT_FALSE(InstrumentationScope::active());
    EXPECT_EQ(tr.stats(kCpu).current_instrumentation, 3000);
    measured = Tensor();  // released outside the scope: found by its id
    EXPECT_EQ(tr.stats(kCpu).current_instrumentation, 1000);
    Tensor more = Tensor::empty({125}, DType::F32, {kCpu, MemCategory::ACTIVATIONS, "run activations"});
    const DeviceMemoryStats st = tr.stats(kCpu);
    EXPECT_EQ(st.peak_total, 7000);
    EXPECT_EQ(st.peak_instrumentation, 3000);
    EXPECT_EQ(st.peak_without_instrumentation, 4500);
    // By category: activations peaked at 2000 B with the dense reference's 2000 B in them, the
    // run's own activations at 500 B; the cache is the run's alone; kv_fidelity is all instrumentation.
    EXPECT_EQ(st.peak[size_t(MemCategory::ACTIVATIONS)], 2000);
    EXPECT_EQ(st.peak_without_instrumentation_by_category[size_t(MemCategory::ACTIVATIONS)], 500);
    EXPECT_EQ(st.peak_without_instrumentation_by_category[size_t(MemCategory::KV_CACHE)], 4000);
    EXPECT_EQ(st.peak_without_instrumentation_by_category[size_t(MemCategory::KV_FIDELITY)], 0);
    EXPECT_EQ(st.current_instrumentation_by_category[size_t(MemCategory::KV_FIDELITY)], 1000);
    // The events carry the flag and the running instrumentation total, on allocation and release.
    ASSERT_EQ(sink.events.size(), 5u);
    const bool want[] = {false, true, true, true, false};
    const int64_t total[] = {0, 1000, 3000, 1000, 1000};
    for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(sink.events[i].instrumentation, want[i]) << "event " << i;
        EXPECT_EQ(sink.events[i].instrumentation_total, total[i]) << "event " << i;
    }
    tr.remove_sink(&sink);
}

TEST(MemoryTracker, InstrumentationScopeTimeCountsOnceWhenNested) {
    // The counted time lies within the outer scope's own wall time, measured around it here;
    // counted twice it would be about twice that.
    const double t0 = InstrumentationScope::thread_seconds();
    const auto w0 = std::chrono::steady_clock::now();
    std::chrono::steady_clock::time_point w1, w2;
    {
        InstrumentationScope outer;
        w1 = std::chrono::steady_clock::now();
        {
            InstrumentationScope inner;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        w2 = std::chrono::steady_clock::now();
    }
    const auto w3 = std::chrono::steady_clock::now();
    const double dt = InstrumentationScope::thread_seconds() - t0;
    EXPECT_GE(dt, std::chrono::duration<double>(w2 - w1).count());
    EXPECT_LE(dt, std::chrono::duration<double>(w3 - w0).count()) << "nested scopes count their time once";
}

TEST(MemoryTracker, BudgetRefusalNamesCategoryRequestAndBudget) {
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    tr.set_budget(kCpu, 10000);
    Tensor keep = Tensor::empty({1000}, DType::F32, {kCpu, MemCategory::WEIGHTS, "wte"});
    try {
        Tensor big = Tensor::empty({2000}, DType::F32, {kCpu, MemCategory::KV_CACHE, "layer 3 values"});
        FAIL() << "allocation over the budget succeeded";
    } catch (const BudgetError& e) {
        std::string m = e.what();
        EXPECT_NE(m.find("kv_cache"), std::string::npos) << m;
        EXPECT_NE(m.find("layer 3 values"), std::string::npos) << m;
        EXPECT_NE(m.find("7.81 KiB"), std::string::npos) << m;  // the request: 8000 B
        EXPECT_NE(m.find("9.77 KiB budget"), std::string::npos) << m;  // 10000 B
        EXPECT_NE(m.find("weights 3.91 KiB"), std::string::npos) << m;  // what is in use
        EXPECT_FALSE(e.hint().empty());
    }
    // Nothing was allocated by the refused request; a fitting one still works.
    EXPECT_EQ(tr.current_total(kCpu), 4000);
    Tensor fits = Tensor::empty({1500}, DType::F32, {kCpu, MemCategory::KV_CACHE, "ok"});
    EXPECT_EQ(tr.current_total(kCpu), 10000);
    tr.set_budget(kCpu, -1);
    Tensor unlimited = Tensor::empty({100000}, DType::F32);
    EXPECT_GT(tr.current_total(kCpu), 10000);
}

TEST(MemoryTracker, ExternalMemoryIsAccountedNotFreed) {
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    auto owner = std::make_shared<std::vector<float>>(64, 1.0f);
    {
        Tensor t = Tensor::from_external(owner->data(), {64}, DType::F32, owner, {kCpu, MemCategory::WEIGHTS, "mmap"});
        EXPECT_EQ(tr.current(kCpu, MemCategory::WEIGHTS), 256);
        EXPECT_FLOAT_EQ(t.to_f32_vector()[5], 1.0f);
    }
    EXPECT_EQ(tr.current_total(kCpu), 0);
    EXPECT_EQ(owner->size(), 64u);  // the owner still holds its memory
}

TEST(MemoryTracker, CategoryNamesRoundTrip) {
    for (size_t c = 0; c < kNumMemCategories; ++c)
        EXPECT_EQ(mem_category_from_name(mem_category_name(MemCategory(c))), MemCategory(c));
    EXPECT_THROW(mem_category_from_name("heap"), Error);
}

TEST(MemoryTracker, ThreadsSharingATrackerBalance) {
    MemoryTracker tr;
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
        ts.emplace_back([&tr] {
            MemoryTrackerScope scope(tr);
            for (int i = 0; i < 500; ++i) {
                Tensor a = Tensor::empty({int64_t(1 + i % 17)}, DType::F32, {kCpu, MemCategory::WORKSPACE, ""});
            }
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(tr.current_total(kCpu), 0);
    EXPECT_GT(tr.peak_total(kCpu), 0);
}

}  // namespace
}  // namespace kv
