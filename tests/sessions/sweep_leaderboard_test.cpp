// `kvlab sweep --format leaderboard` (sessions/sweep_results.h): on a hand-made table of two
// methods x two ratios x three tasks (plus dense), every cell is the mean over tasks with the
// sample standard error over sqrt(n), worked out here by hand; dense fills every column; a
// compress-then-ask sweep's compression ratio is a size axis too, and its score threshold (rows
// named dms(<cache>)); a table without a cache-size
// axis is refused naming what is expected.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "engine/core/error.h"
#include "sessions/sweep_results.h"

namespace kv {
namespace {

sessions::SweepTableRow row(const std::string& method, const std::string& task, const std::string& ratio, double v) {
    sessions::SweepTableRow r;
    r.cells = {method, task, ratio};
    r.value = v;
    r.has_value = true;
    r.n = 1;
    return r;
}

// The cell "mean +- se (n)" of `method` under column `col` (1-based among the ratio columns).
std::string cell(const std::string& board, const std::string& method, int col) {
    std::istringstream in(board);
    for (std::string line; std::getline(in, line);)
        if (line.rfind("| " + method + " |", 0) == 0) {
            std::vector<std::string> parts;
            for (size_t a = 1, b; (b = line.find('|', a)) != std::string::npos; a = b + 1) parts.push_back(line.substr(a, b - a));
            return parts.size() > size_t(col) ? parts[size_t(col)] : "";
        }
    return "";
}

TEST(SweepLeaderboard, MeanAndStandardErrorOverTasksPerMethodAndRatio) {
    sessions::SweepTable t;
    t.columns = {"kv_cache.name", "data", "kv_cache.ratio"};
    t.metric = "accuracy";
    for (const char* task : {"niah_single", "vt", "qa_1"}) t.rows.push_back(row("dense-default", task, "-", 1.0));
    // h2o at 0.5 (listed before 0.25: columns sort by ratio): 0.9, 0.6, 0.3 -> mean 0.6,
    // sd = sqrt(((0.3)^2 + 0 + (0.3)^2) / 2) = 0.3, se = 0.3 / sqrt(3) = 0.173205...
    t.rows.push_back(row("h2o-default", "niah_single", "0.5", 0.9));
    t.rows.push_back(row("h2o-default", "vt", "0.5", 0.6));
    t.rows.push_back(row("h2o-default", "qa_1", "0.5", 0.3));
    // h2o at 0.25: 0.5, 0.5, 0.2 -> mean 0.4, sd = sqrt((0.01 + 0.01 + 0.04) / 2) = sqrt(0.03), se = 0.1
    t.rows.push_back(row("h2o-default", "niah_single", "0.25", 0.5));
    t.rows.push_back(row("h2o-default", "vt", "0.25", 0.5));
    t.rows.push_back(row("h2o-default", "qa_1", "0.25", 0.2));
    // lastrec: one task only at 0.25 (se 0), none at 0.5
    t.rows.push_back(row("lastrec-default", "vt", "0.25", 0.125));
    sessions::SweepTableRow failed = row("lastrec-default", "qa_1", "0.5", 0);
    failed.has_value = false;  // a failed cell is no value
    t.rows.push_back(failed);
    const std::string b = sessions::format_sweep_leaderboard(t);
    EXPECT_NE(b.find("| method | kept 0.25 | kept 0.5 |"), std::string::npos) << b;
    EXPECT_NE(b.find("3 tasks"), std::string::npos) << b;
    EXPECT_EQ(cell(b, "h2o-default", 1), " 0.4 +- 0.1 (3) ") << b;
    EXPECT_EQ(cell(b, "h2o-default", 2), " 0.6 +- 0.17 (3) ") << b;
    EXPECT_EQ(cell(b, "dense-default", 1), " 1 +- 0 (3) ") << b;
    EXPECT_EQ(cell(b, "dense-default", 2), " 1 +- 0 (3) ") << b;
    EXPECT_EQ(cell(b, "lastrec-default", 1), " 0.125 +- 0 (1) ") << b;
    EXPECT_EQ(cell(b, "lastrec-default", 2), " - ") << b;

    // compress-then-ask's sweep: the compression ratio is the size axis, columns "r = ...".
    sessions::SweepTable ask = t;
    ask.columns = {"kv_cache.name", "data", "kv_cache.compression_ratio"};
    const std::string c = sessions::format_sweep_leaderboard(ask);
    EXPECT_NE(c.find("| method | r = 0.25 | r = 0.5 |"), std::string::npos) << c;
    EXPECT_NE(c.find("the fraction of each context dropped"), std::string::npos) << c;
    EXPECT_EQ(cell(c, "h2o-default", 1), " 0.4 +- 0.1 (3) ") << c;

    // A sweep over thresholds (kvpress sweeps DMS and KVzap so): columns "t = ...", each method a
    // dms row over its scorer, dense (no threshold) as itself.
    sessions::SweepTable dms = t;
    dms.columns = {"kv_cache.name", "data", "kv_cache.score_threshold"};
    const std::string d = sessions::format_sweep_leaderboard(dms);
    EXPECT_NE(d.find("| method | t = 0.25 | t = 0.5 |"), std::string::npos) << d;
    EXPECT_NE(d.find("each method as dms over its scores"), std::string::npos) << d;
    EXPECT_EQ(cell(d, "dms(h2o-default)", 2), " 0.6 +- 0.17 (3) ") << d;
    EXPECT_EQ(cell(d, "dense-default", 1), " 1 +- 0 (3) ") << d;
    EXPECT_EQ(d.find("dms(dense-default)"), std::string::npos) << d;

    sessions::SweepTable no_size;
    no_size.columns = {"kv_cache.name", "data"};
    no_size.metric = "accuracy";
    try {
        sessions::format_sweep_leaderboard(no_size);
        FAIL() << "a sweep without a cache-size axis has no leaderboard";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expected a sweep over --kv_cache.name and --kv_cache.ratio"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv
