// `kvlab bench policies` on kvzip: its row is marked as a two-pass policy and carries no
// single-pass target (it reports its own cost factor, docs/PERFORMANCE.md "KV policies").
#include <gtest/gtest.h>

#include <string>

#include "bench/policy_bench.h"

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
    const PolicyBenchResult res = run_policy_bench(o, [](int, int, const std::string&) {});
    ASSERT_EQ(res.rows.size(), 3u);  // the lastrec noise control, kvzip, h2o
    EXPECT_EQ(res.rows[1].policy, "kvzip-default");
    EXPECT_EQ(res.rows[1].note, " [+ reconstruction pass]");
    EXPECT_EQ(res.rows[1].target, 0.0);
    EXPECT_TRUE(res.rows[1].pass());
    EXPECT_EQ(res.rows[1].cpu_ratio_median, res.rows[1].base_cpu[0] / res.rows[1].policy_cpu[0]);
    EXPECT_EQ(res.rows[2].policy, "h2o-default");
    EXPECT_EQ(res.rows[2].note, "");
    EXPECT_EQ(res.rows[2].target, 0.9);
}

}  // namespace
}  // namespace kv::bench
