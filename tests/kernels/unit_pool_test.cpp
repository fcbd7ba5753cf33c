// run_units (kernels/cpu/unit_pool.h): every unit runs exactly once, for any thread count,
// back-to-back calls and concurrent callers; results are ready when the call returns.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "kernels/cpu/unit_pool.h"

namespace kv::cpu {
namespace {

TEST(UnitPool, EveryUnitRunsOnceForAnyThreadCount) {
    for (int threads : {1, 2, 3, 8})
        for (int64_t units : {0, 1, 2, 7, 1000}) {
            std::vector<std::atomic<int>> hits((size_t)units);
            for (auto& h : hits) h = 0;
            run_units(threads, units, [&](int64_t u) { hits[size_t(u)].fetch_add(1); });
            for (int64_t u = 0; u < units; ++u) ASSERT_EQ(hits[size_t(u)].load(), 1) << "threads " << threads << " unit " << u;
        }
}

TEST(UnitPool, ManyShortCallsSeeCompleteResults) {
    std::vector<int64_t> out(64);
    for (int call = 0; call < 2000; ++call) {
        run_units(2, int64_t(out.size()), [&](int64_t u) { out[size_t(u)] = call * 100 + u; });
        for (size_t u = 0; u < out.size(); ++u) ASSERT_EQ(out[u], call * 100 + int64_t(u)) << "call " << call;
    }
}

TEST(UnitPool, ConcurrentCallersQueue) {
    std::atomic<int64_t> total{0};
    std::vector<std::thread> callers;
    for (int t = 0; t < 4; ++t)
        callers.emplace_back([&] {
            for (int call = 0; call < 200; ++call) run_units(2, 16, [&](int64_t u) { total.fetch_add(u + 1); });
        });
    for (auto& c : callers) c.join();
    EXPECT_EQ(total.load(), 4 * 200 * (16 * 17 / 2));
}

}  // namespace
}  // namespace kv::cpu
