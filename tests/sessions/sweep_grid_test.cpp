// Sweep grids and tables: every combination of the axes appears exactly once with its dense
// reference per data configuration; sweep-only axes (buffer, ratio) resolve as documented;
// bad grids fail before anything runs; the table's numbers are the session's summaries and
// their differences to the reference run of the same data configuration.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "sessions/sweep_grid.h"
#include "sessions/sweep_results.h"
#include "storage/session.h"

namespace kv {
namespace {

using sessions::SweepCell;

RunConfig base() {
    RunConfig c;
    c.mode = "eval_long";
    c.model = "tiny";
    c.data.name = "passkey";
    c.data.seq_length = 256;
    c.driver.chunk_size = 16;
    return c;
}

std::vector<SweepCell> expand(const std::vector<std::pair<std::string, std::string>>& opts, sessions::SweepSpec* out = nullptr) {
    auto spec = sessions::make_sweep_spec(base(), opts);
    if (out) *out = spec;
    return sessions::expand_sweep(spec);
}

TEST(SweepGrid, EveryCombinationOnceWithOneDenseReferencePerDataConfiguration) {
    auto cells = expand({{"kv_cache.name", "h2o,lastrec,tova"}, {"kv_cache.cache_length", "32,64"}, {"data.seq_length", "256,512"}});
    // 2 data configurations x (1 reference + 3 x 2 cells)
    ASSERT_EQ(cells.size(), 2u * (1 + 6));
    std::set<std::tuple<std::string, int64_t, int64_t>> seen;
    std::map<int64_t, int> refs;
    for (const auto& c : cells) {
        EXPECT_TRUE(seen.insert({c.cfg.kv_cache.name, c.cfg.kv_cache.cache_length, c.cfg.data.seq_length}).second) << c.cfg.name;
        if (c.reference) {
            EXPECT_EQ(c.cfg.kv_cache.name, "dense-default");
            EXPECT_EQ(c.cfg.kv_cache.cache_length, 0);
            // It steps in the compared runs' chunks: its first chunk is their smallest cache (32).
            EXPECT_EQ(c.cfg.driver.prefill_length, 32);
            ++refs[c.cfg.data.seq_length];
        }
        EXPECT_TRUE(run_config_problems(c.cfg).empty()) << c.cfg.name;
        EXPECT_EQ(c.identity, sessions::sweep_identity(c.cfg));
    }
    EXPECT_EQ(refs[256], 1);
    EXPECT_EQ(refs[512], 1);
    for (const char* p : {"h2o-default", "lastrec-default", "tova-default"})
        for (int64_t L : {32, 64})
            for (int64_t T : {256, 512}) EXPECT_TRUE(seen.count({p, L, T})) << p << " L=" << L << " T=" << T;
    // each data configuration starts with its reference; cells share the reference's key
    EXPECT_TRUE(cells[0].reference);
    for (size_t i = 1; i < 7; ++i) {
        EXPECT_FALSE(cells[i].reference);
        EXPECT_EQ(cells[i].reference_key, cells[0].reference_key);
        EXPECT_EQ(cells[i].cfg.data.seq_length, cells[0].cfg.data.seq_length);
    }
    EXPECT_TRUE(cells[7].reference);
    EXPECT_NE(cells[7].reference_key, cells[0].reference_key);
    // names say policy, length and the varying data option
    EXPECT_EQ(cells[1].cfg.name, "h2o-default L=32 data.seq_length=256");
}

TEST(SweepGrid, BufferAxisJoinsPolicyNamesAndRatioSetsTheCacheLength) {
    auto cells = expand({{"kv_cache.name", "h2o,lastrec-q4"}, {"kv_cache.buffer", "default,q8"}, {"kv_cache.ratio", "0.25,0.5"}});
    std::set<std::pair<std::string, int64_t>> got;
    for (const auto& c : cells)
        if (!c.reference) got.insert({c.cfg.kv_cache.name, c.cfg.kv_cache.cache_length});
    // lastrec-q4 names its buffer; the buffer axis joins only bare policy names... and replaces
    // the buffer of full names (documented: kv_cache.buffer decides the buffer when given)
    const std::set<std::pair<std::string, int64_t>> want = {{"h2o-default", 64},     {"h2o-default", 128},
                                                             {"h2o-q8", 64},          {"h2o-q8", 128},
                                                             {"lastrec-default", 64}, {"lastrec-default", 128},
                                                             {"lastrec-q8", 64},      {"lastrec-q8", 128}};
    EXPECT_EQ(got, want);
    size_t refs = 0;
    for (const auto& c : cells) refs += c.reference;
    EXPECT_EQ(refs, 1u);  // buffer and ratio are cache axes: one data configuration
}

TEST(SweepGrid, DenseInTheGridIsTheReference) {
    auto cells = expand({{"kv_cache.name", "dense,h2o"}, {"kv_cache.cache_length", "32,64"}});
    ASSERT_EQ(cells.size(), 1u + 2u);
    EXPECT_TRUE(cells[0].reference);
    for (size_t i = 1; i < cells.size(); ++i) EXPECT_EQ(cells[i].cfg.kv_cache.name, "h2o-default");
}

TEST(SweepGrid, OneCompressionBudgetLeavesTheReferenceUncompressed) {
    // One value of a cache option applies to every cell, but compress-then-ask's budgets are the
    // compared runs' alone: dense never evicts, and a budget on it is refused.
    for (const auto& [opt, val] : std::vector<std::pair<std::string, std::string>>{
             {"kv_cache.compression_ratio", "0.5"}, {"kv_cache.keep_tokens", "100"}, {"kv_cache.decode_ratio", "0.5"}}) {
        SCOPED_TRACE(opt);
        auto cells = expand({{"protocol", "compress-then-ask"}, {"data", "niah_single"}, {"kv_cache.name", "snapkv,h2o"}, {opt, val}});
        ASSERT_EQ(cells.size(), 3u);
        int refs = 0;
        for (const auto& c : cells) {
            EXPECT_TRUE(run_config_problems(c.cfg).empty()) << c.cfg.name;
            const bool budget = c.cfg.protocol.compression_ratio > 0 || c.cfg.protocol.keep_tokens > 0 || c.cfg.protocol.decode_ratio > 0;
            EXPECT_EQ(budget, !c.reference) << c.cfg.name;
            refs += c.reference;
        }
        EXPECT_EQ(refs, 1);
    }
}

TEST(SweepGrid, APerHeadRatioTableStaysOffTheReference) {
    // lukv-*'s table is one value for every compared cell; dense keeps one budget for every head
    // and refuses a table, so the reference runs without it.
    auto cells = expand({{"kv_cache.name", "lukv-knorm,lukv-h2o"}, {"kv_cache.head_ratios", "pattern:1 0.5"}, {"kv_cache.cache_length", "64"}});
    ASSERT_EQ(cells.size(), 3u);
    int refs = 0;
    for (const auto& c : cells) {
        EXPECT_TRUE(run_config_problems(c.cfg).empty()) << c.cfg.name;
        EXPECT_EQ(c.cfg.kv_cache.head_ratios.empty(), c.reference) << c.cfg.name;
        refs += c.reference;
    }
    EXPECT_EQ(refs, 1);
}

TEST(SweepGrid, BadGridsFailBeforeAnythingRuns) {
    auto msg = [](const std::vector<std::pair<std::string, std::string>>& o) {
        try {
            expand(o);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.cache_length", "8,64"}}).find("larger than the cache length 8"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.cache_length", "32,abc"}}).find("'abc' is not an integer"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o,nonsense"}, {"kv_cache.cache_length", "32"}}).find("nonsense"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.cache_length", "32,32"}}).find("appears twice"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.cache_length", "32,"}}).find("empty item"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.ratio", "0.25"}, {"kv_cache.cache_length", "32"}}).find("both set the cache size"),
              std::string::npos);
    EXPECT_NE(msg({{"kv_cache.name", "h2o"}, {"kv_cache.ratio", "1.5"}}).find("expected a number in (0, 1]"), std::string::npos);
    EXPECT_NE(msg({{"kv_cache.bogus", "1,2"}}).find("unknown option --kv_cache.bogus"), std::string::npos);
}

TEST(SweepGrid, ListValuedOptionsKeepTheirCommas) {
    auto cells = expand({{"data.depths", "0.25,0.75"}, {"kv_cache.name", "h2o,lastrec"}, {"kv_cache.cache_length", "64"}});
    ASSERT_EQ(cells.size(), 3u);
    for (const auto& c : cells) EXPECT_EQ(c.cfg.data.depths, (std::vector<double>{0.25, 0.75}));
}

TEST(SweepGrid, IdentityIgnoresNameAndTelemetryOnly) {
    RunConfig a = base(), b = base();
    b.name = "something else";
    b.telemetry.enabled = false;
    EXPECT_EQ(sessions::sweep_identity(a), sessions::sweep_identity(b));
    b.kv_cache.cache_length = 64;
    EXPECT_NE(sessions::sweep_identity(a), sessions::sweep_identity(b));
}

// ---- tables from a session -----------------------------------------------------------------

struct TempFile {
    std::string path;
    TempFile() {
        path = (std::filesystem::temp_directory_path() / ("kvlab-sweep-table-" + std::to_string(::getpid()) + ".kvlab")).string();
        std::filesystem::remove(path);
    }
    ~TempFile() {
        for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
    }
};

std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
        std::vector<std::string> f;
        std::string cur;
        for (char c : line) {
            if (c == ',') {
                f.push_back(cur);
                cur.clear();
            } else {
                cur += c;
            }
        }
        f.push_back(cur);
        rows.push_back(f);
    }
    return rows;
}

TEST(SweepTable, NumbersAreTheRunsSummariesAndDifferencesToTheirReference) {
    sessions::SweepSpec spec;
    auto cells = expand({{"kv_cache.name", "h2o,lastrec"}, {"kv_cache.cache_length", "32,64"}, {"data.seq_length", "256,512"}}, &spec);
    TempFile f;
    auto session = storage::Session::create(f.path);
    // Record every cell but one with a made-up perplexity; an unrelated run must not count.
    std::map<std::string, double> ppl;  // identity -> value
    for (size_t i = 0; i + 1 < cells.size(); ++i) {
        const double v = 10.0 + double(i) * 1.25;
        const int64_t id = session->create_run(cells[i].cfg.name, run_config_to_json(cells[i].cfg));
        session->start_run(id);
        session->merge_summary(id, nlohmann::json{{"perplexity", v}, {"accuracy", 0.5}}.dump());
        session->finish_run(id, storage::RunStatus::DONE);
        ppl[cells[i].identity] = v;
    }
    {  // the last cell failed: no number, its status instead
        const int64_t id = session->create_run(cells.back().cfg.name, run_config_to_json(cells.back().cfg));
        session->start_run(id);
        session->finish_run(id, storage::RunStatus::FAILED, "boom");
    }
    RunConfig other = base();
    other.model_seed = 99;
    const int64_t stray = session->create_run("stray", run_config_to_json(other));
    session->start_run(stray);
    session->merge_summary(stray, R"({"perplexity": 1000})");
    session->finish_run(stray, storage::RunStatus::DONE);

    auto t = sessions::make_sweep_table(cells, spec.axes, *session);
    EXPECT_EQ(t.metric, "perplexity");  // auto prefers perplexity over accuracy
    const auto rows = parse_csv(sessions::format_sweep_table(t, "csv"));
    ASSERT_EQ(rows.size(), cells.size() + 1);
    const std::vector<std::string> head = {"kv_cache.name", "kv_cache.cache_length", "data.seq_length", "run", "perplexity",
                                           "delta_vs_dense", "delta_percent"};
    EXPECT_EQ(rows[0], head);
    std::map<int64_t, double> ref_by_T;
    for (const auto& c : cells)
        if (c.reference) ref_by_T[c.cfg.data.seq_length] = ppl.at(c.identity);
    for (size_t i = 0; i < cells.size(); ++i) {
        const auto& r = rows[i + 1];
        ASSERT_EQ(r.size(), head.size());
        EXPECT_EQ(r[0], cells[i].cfg.kv_cache.name);
        EXPECT_EQ(r[1], cells[i].reference ? "-" : std::to_string(cells[i].cfg.kv_cache.cache_length));
        EXPECT_EQ(r[2], std::to_string(cells[i].cfg.data.seq_length));
        if (i + 1 == cells.size()) {  // failed: no done run
            EXPECT_EQ(r[3], "-");
            EXPECT_EQ(r[4], "failed");
            EXPECT_EQ(r[5], "");
            continue;
        }
        const double v = ppl.at(cells[i].identity), ref = ref_by_T.at(cells[i].cfg.data.seq_length);
        EXPECT_NEAR(std::stod(r[4]), v, 1e-4 * v);
        EXPECT_NEAR(std::stod(r[5]), v - ref, 1e-3);
        EXPECT_NEAR(std::stod(r[6]), 100.0 * (v / ref - 1), 0.0051);
    }
    // the other formats carry the same numbers
    const auto j = nlohmann::json::parse(sessions::format_sweep_table(t, "json"));
    ASSERT_EQ(j.size(), cells.size());
    EXPECT_NEAR(j[1]["perplexity"].get<double>(), ppl.at(cells[1].identity), 1e-9);
    EXPECT_TRUE(j[cells.size() - 1]["perplexity"].is_null());
    const std::string md = sessions::format_sweep_table(t, "md");
    EXPECT_NE(md.find("| kv_cache.name | kv_cache.cache_length | data.seq_length | run | perplexity | Δ vs dense | Δ % |"), std::string::npos);
    EXPECT_THROW(sessions::format_sweep_table(t, "xlsx"), Error);
    // an explicit metric
    auto ta = sessions::make_sweep_table(cells, spec.axes, *session, "accuracy");
    EXPECT_EQ(ta.metric, "accuracy");
    EXPECT_DOUBLE_EQ(ta.rows[2].value, 0.5);
    EXPECT_DOUBLE_EQ(ta.rows[2].value - ta.rows[2].reference, 0.0);
}

TEST(SweepTable, ACellRunTwiceIsItsMeanWithNAndStandardError) {
    sessions::SweepSpec spec;
    auto cells = expand({{"kv_cache.name", "h2o"}, {"kv_cache.cache_length", "32"}}, &spec);
    ASSERT_EQ(cells.size(), 2u);  // the dense reference and the h2o cell
    TempFile f;
    auto session = storage::Session::create(f.path);
    auto record = [&](const sessions::SweepCell& c, double ppl) {
        const int64_t id = session->create_run(c.cfg.name, run_config_to_json(c.cfg));
        session->start_run(id);
        session->merge_summary(id, nlohmann::json{{"perplexity", ppl}}.dump());
        session->finish_run(id, storage::RunStatus::DONE);
        return id;
    };
    const size_t ref = cells[0].reference ? 0 : 1, h2o = 1 - ref;
    record(cells[ref], 8.0);
    const int64_t a = record(cells[h2o], 10.0), b = record(cells[h2o], 12.0);
    const auto t = sessions::make_sweep_table(cells, spec.axes, *session);
    const sessions::SweepTableRow& r = t.rows[h2o];
    // runs of 10 and 12: mean 11; sample s.d. sqrt(2), standard error sqrt(2) / sqrt(2) = 1
    EXPECT_DOUBLE_EQ(r.value, 11.0);
    EXPECT_EQ(r.n, 2);
    EXPECT_DOUBLE_EQ(r.se, 1.0);
    EXPECT_EQ(r.runs, (std::vector<int64_t>{a, b}));
    EXPECT_EQ(r.run, b) << "the newest run names the cell";
    EXPECT_EQ(t.rows[ref].n, 1);
    const auto rows = parse_csv(sessions::format_sweep_table(t, "csv"));
    // (one cache length: not a column)
    EXPECT_EQ(rows[0], (std::vector<std::string>{"kv_cache.name", "run", "perplexity", "n", "se", "delta_vs_dense", "delta_percent"}));
    EXPECT_EQ(rows[h2o + 1][3], "2");
    EXPECT_EQ(rows[h2o + 1][4], "1");
    EXPECT_DOUBLE_EQ(std::stod(rows[h2o + 1][5]), 3.0) << "mean 11 against the dense 8";
    const std::string text = sessions::format_sweep_table(t, "table");
    EXPECT_NE(text.find("1 cell was run more than once: perplexity is the mean of its n runs, se its standard error"), std::string::npos) << text;
    const auto j = nlohmann::json::parse(sessions::format_sweep_table(t, "json"));
    EXPECT_EQ(j[h2o]["n"], 2);
    EXPECT_EQ(j[h2o]["runs"].size(), 2u);
}

}  // namespace
}  // namespace kv

namespace kv {
namespace {

// `kvlab plot --where` (line figures and needle maps): every condition must hold, and a
// condition holds when the run's value is one of its '|'-separated alternatives, compared whole.
TEST(SweepResults, WhereKeepsRunsWhoseValueIsOneOfTheAlternatives) {
    RunConfig c = base();
    c.kv_cache.name = "h2o-default";
    c.kv_cache.cache_length = 64;
    using W = std::vector<std::pair<std::string, std::string>>;
    EXPECT_TRUE(sessions::run_matches_where(c, W{}));
    EXPECT_TRUE(sessions::run_matches_where(c, W{{"kv_cache.policy", "h2o"}}));
    EXPECT_TRUE(sessions::run_matches_where(c, W{{"kv_cache.policy", "lastrec|h2o|tova"}}));
    EXPECT_FALSE(sessions::run_matches_where(c, W{{"kv_cache.policy", "lastrec|tova"}}));
    EXPECT_FALSE(sessions::run_matches_where(c, W{{"kv_cache.policy", "h2"}})) << "values compare whole, not as prefixes";
    EXPECT_FALSE(sessions::run_matches_where(c, W{{"kv_cache.policy", "h2o2|xh2o"}}));
    EXPECT_TRUE(sessions::run_matches_where(c, W{{"kv_cache.policy", "h2o"}, {"data.seq_length", "128|256"}}));
    EXPECT_FALSE(sessions::run_matches_where(c, W{{"kv_cache.policy", "h2o"}, {"data.seq_length", "512"}})) << "every condition must hold";
    EXPECT_THROW(sessions::run_matches_where(c, W{{"no.such.option", "1"}}), Error);
}

}  // namespace
}  // namespace kv
