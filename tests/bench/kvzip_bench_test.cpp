// `kvlab bench policies` on kvzip: its row is marked as a two-pass policy and carries no
// single-pass target (it reports its own cost factor, docs/PERFORMANCE.md "KV policies").
#include <gtest/gtest.h>

#include <string>

#include "bench/cache_bench.h"

namespace kv::bench {
namespace {

TEST(PolicyBench, KVzipRowReportsItsOwnFactorWithoutTheSinglePassTarget) {
    PolicyBenchOptions o;
    o.model = "tiny";
    o.tokens = 96;
    o.cache_length = 32;
    o.chunk = 16;
    o.repeats = 1;
    o.policies = {"kvzip", "h2o"};
    const std::vector<CacheBenchRow> rows = run_policy_bench(o, [](int, int, const std::string&) {});
    ASSERT_EQ(rows.size(), 3u);  // lastrec-default baseline, kvzip, h2o
    EXPECT_EQ(rows[1].name, "kvzip-default / lastrec-default [+ reconstruction pass]");
    EXPECT_EQ(rows[1].target, 0.0);
    EXPECT_NEAR(rows[1].ratio, rows[1].a / rows[1].b, 1e-9 * rows[1].ratio);
    EXPECT_EQ(rows[2].name, "h2o-default / lastrec-default");
    EXPECT_EQ(rows[2].target, 0.9);
}

}  // namespace
}  // namespace kv::bench
