// `kvlab bench policies` (bench/policy_bench.h): a lastrec-vs-lastrec noise control first, then
// one row per policy compared with lastrec on its own buffer in interleaved rounds; the printed
// table carries the CPU and wall columns and the load average, and every printed CPU ratio is
// the baseline's CPU time over the policy's, recomputed here from the printed per-round times.
// Measured on the tiny model; no speed is asserted. An unknown policy gets one clear message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "bench/policy_bench.h"
#include "engine/core/error.h"

namespace kv::bench {
namespace {

// The printed line of a table row / a per-round row, found by its leading name.
std::string line_starting(const std::string& text, const std::string& prefix) {
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
        if (l.rfind(prefix, 0) == 0) return l;
    return "";
}

TEST(PolicyBench, RowsCompareEachPolicyWithLastrecOnItsOwnBufferInCpuTime) {
    PolicyBenchOptions o;
    o.model = "tiny";
    o.tokens = 96;
    o.cache_length = 32;
    o.chunk = 16;
    o.repeats = 3;
    o.policies = {"h2o", "qh2o", "expected-attention"};
    const PolicyBenchResult res = run_policy_bench(o, [](int, int, const std::string&) {});
    ASSERT_EQ(res.rows.size(), 4u);  // the noise control, then the three policies
    const std::vector<std::pair<std::string, std::string>> want = {{"lastrec-default", "lastrec-default"},
                                                                  {"h2o-default", "lastrec-default"},
                                                                  {"qh2o-q8", "lastrec-q8"},
                                                                  {"expected-attention-default", "lastrec-default"}};
    const std::string text = format_policy_bench(res);
    for (const char* col : {"cpu ms", "lastrec ms", "cpu ratio [min-max]", "wall tok/s", "target", "load average at start", "at end",
                            "per-round cpu ms (lastrec | policy)", "lastrec-default / lastrec-default (noise control)"})
        EXPECT_NE(text.find(col), std::string::npos) << "missing '" << col << "' in:\n" << text;
    for (size_t i = 0; i < want.size(); ++i) {
        const PolicyBenchRow& r = res.rows[i];
        EXPECT_EQ(r.policy, want[i].first);
        EXPECT_EQ(r.baseline, want[i].second) << r.policy << ": compared with the wrong baseline";
        EXPECT_EQ(r.target, 0.9);
        ASSERT_EQ(r.base_cpu.size(), 3u);
        ASSERT_EQ(r.policy_cpu.size(), 3u);
        // The printed per-round times: "  NAME b1|p1 b2|p2 b3|p3".
        const std::string rounds = line_starting(text, "  " + r.policy + " ");
        ASSERT_FALSE(rounds.empty()) << r.policy << " has no per-round line in:\n" << text;
        std::istringstream in(rounds.substr(2 + r.policy.size()));
        std::vector<double> b, p, ratio;
        for (std::string tok; in >> tok;) {
            const size_t bar = tok.find('|');
            ASSERT_NE(bar, std::string::npos) << rounds;
            b.push_back(std::stod(tok.substr(0, bar)));
            p.push_back(std::stod(tok.substr(bar + 1)));
            ASSERT_GT(b.back(), 0.0) << rounds;
            ASSERT_GT(p.back(), 0.0) << rounds;
            ratio.push_back(b.back() / p.back());
        }
        ASSERT_EQ(ratio.size(), 3u) << rounds;
        std::vector<double> sorted = ratio;
        std::sort(sorted.begin(), sorted.end());
        // Printed to 0.001 ms: the ratio of rounded times is off by at most this much (+ the
        // ratio's own rounding to 0.001).
        const double tmin = std::min(*std::min_element(b.begin(), b.end()), *std::min_element(p.begin(), p.end()));
        const double tol = 0.0006 + 2 * sorted[2] * 0.0005 / tmin;
        // The row: "NAME / BASE [(noise control)] CPU_MS LASTREC_MS MED x [MIN-MAX] ..."
        std::string row = line_starting(text, r.policy + " / " + r.baseline);
        ASSERT_FALSE(row.empty()) << r.policy << " has no row in:\n" << text;
        row = row.substr(row.find(r.baseline) + r.baseline.size());
        if (i == 0) row = row.substr(row.find(')') + 1);
        std::istringstream rs(row);
        double cpu_ms = 0, base_ms = 0, med = 0, lo = 0, hi = 0;
        char x = 0, open = 0, dash = 0, close = 0;
        rs >> cpu_ms >> base_ms >> med >> x >> open >> lo >> dash >> hi >> close;
        ASSERT_TRUE(rs && x == 'x' && open == '[' && dash == '-' && close == ']') << "cannot read the row: " << row;
        EXPECT_NEAR(med, sorted[1], tol) << r.policy << ": the cpu ratio is not the median of lastrec cpu / policy cpu";
        EXPECT_NEAR(lo, sorted[0], tol) << r.policy;
        EXPECT_NEAR(hi, sorted[2], tol) << r.policy;
        std::sort(b.begin(), b.end()), std::sort(p.begin(), p.end());
        EXPECT_NEAR(cpu_ms, p[1], 0.0011) << r.policy << ": the cpu ms column is not the median of the rounds";
        EXPECT_NEAR(base_ms, b[1], 0.0011) << r.policy;
    }
    o.policies = {"no-such-policy"};
    try {
        run_policy_bench(o, [](int, int, const std::string&) {});
        ADD_FAILURE() << "an unknown policy was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("unknown policy 'no-such-policy'"), std::string::npos) << e.what();
    }
}

TEST(PolicyBench, MedianOfOddAndEvenCounts) {
    EXPECT_EQ(median_of({3.0, 1.0, 2.0}), 2.0);
    EXPECT_EQ(median_of({4.0, 1.0, 3.0, 2.0}), 2.5);
    EXPECT_EQ(median_of({7.0}), 7.0);
    EXPECT_THROW(median_of({}), Error);
}

}  // namespace
}  // namespace kv::bench
