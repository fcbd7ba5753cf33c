// `kvlab bench policies` (bench/cache_bench.h): one baseline row per buffer the policies use
// (lastrec on that buffer), then one row per policy whose ratio is its throughput over its own
// buffer's baseline, measured on the tiny model; an unknown policy gets one clear message.
#include <gtest/gtest.h>

#include <string>

#include "bench/cache_bench.h"
#include "engine/core/error.h"

namespace kv::bench {
namespace {

TEST(PolicyBench, RowsCompareEachPolicyWithLastrecOnItsOwnBuffer) {
    PolicyBenchOptions o;
    o.model = "tiny";
    o.tokens = 96;
    o.cache_length = 32;
    o.chunk = 16;
    o.repeats = 1;
    o.policies = {"h2o", "qh2o", "expected-attention"};
    const std::vector<CacheBenchRow> rows = run_policy_bench(o, [](int, int, const std::string&) {});
    ASSERT_EQ(rows.size(), 5u);  // baselines lastrec-default, lastrec-q8; three policies
    EXPECT_EQ(rows[0].name, "lastrec-default (baseline)");
    EXPECT_EQ(rows[1].name, "lastrec-q8 (baseline)");
    const std::vector<std::pair<std::string, size_t>> want = {
        {"h2o-default / lastrec-default", 0}, {"qh2o-q8 / lastrec-q8", 1}, {"expected-attention-default / lastrec-default", 0}};
    for (size_t i = 0; i < want.size(); ++i) {
        const CacheBenchRow& r = rows[2 + i];
        EXPECT_EQ(r.name, want[i].first);
        EXPECT_GT(r.a, 0.0);
        EXPECT_EQ(r.b, rows[want[i].second].a) << r.name << ": compared with the wrong baseline";
        EXPECT_NEAR(r.ratio, r.a / r.b, 1e-9 * r.ratio) << r.name;
        EXPECT_EQ(r.target, 0.9);
    }
    o.policies = {"no-such-policy"};
    try {
        run_policy_bench(o, [](int, int, const std::string&) {});
        ADD_FAILURE() << "an unknown policy was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown policy 'no-such-policy'"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::bench
