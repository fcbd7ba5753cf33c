// Span summaries, the named queries and run diffs against references computed another way:
// self times by a brute-force parent search (innermost containing span, O(n^2)) instead of the
// preorder stack; totals by plain SQL sums; memory peaks straight from the summary JSON. On
// random span trees written through the recorder and the session writer, and on a real tiny
// run recorded by the kvlab CLI.
#include "storage/span_summary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "engine/telemetry/trace.h"
#include "storage/named_queries.h"
#include "storage/run_diff.h"
#include "storage/schema.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "storage/session_writer.h"
#include "storage/sql_query.h"
#include "storage_test_util.h"

namespace kv {
namespace {

using storage::SpanRow;
using storage::SpanStats;
using storage::SpanSummary;
using trace::SpanCategory;

// ---- references ---------------------------------------------------------------------------
// Self time of each span: its duration minus its direct children's, where a span's parent is
// the shortest span on its thread that contains it; of two identical intervals the one written
// later (larger id) contains the other, as a scope that closes later is written later.
std::vector<int64_t> brute_force_self(const std::vector<SpanRow>& s) {
    std::vector<int64_t> self(s.size());
    for (size_t c = 0; c < s.size(); ++c) {
        self[c] += s[c].end_ns - s[c].start_ns;
        long best = -1;
        for (size_t p = 0; p < s.size(); ++p) {
            if (p == c || s[p].thread != s[c].thread) continue;
            if (s[p].start_ns > s[c].start_ns || s[p].end_ns < s[c].end_ns) continue;
            const bool identical = s[p].start_ns == s[c].start_ns && s[p].end_ns == s[c].end_ns;
            if (identical && s[p].id < s[c].id) continue;
            if (best < 0) {
                best = long(p);
                continue;
            }
            const SpanRow& b = s[size_t(best)];
            const int64_t dp = s[p].end_ns - s[p].start_ns, db = b.end_ns - b.start_ns;
            if (dp < db || (dp == db && s[p].id < b.id)) best = long(p);
        }
        if (best >= 0) self[size_t(best)] -= s[c].end_ns - s[c].start_ns;
    }
    return self;
}

struct Ref {
    int64_t count = 0, total = 0, self = 0, min = INT64_MAX, max = INT64_MIN;
};
std::map<std::pair<std::string, int>, Ref> brute_force_groups(const std::vector<SpanRow>& s) {
    const auto self = brute_force_self(s);
    std::map<std::pair<std::string, int>, Ref> out;
    for (size_t i = 0; i < s.size(); ++i) {
        Ref& r = out[{s[i].name, int(s[i].category)}];
        const int64_t d = s[i].end_ns - s[i].start_ns;
        ++r.count;
        r.total += d;
        r.self += self[i];
        r.min = std::min(r.min, d);
        r.max = std::max(r.max, d);
    }
    return out;
}

void expect_matches(const std::vector<SpanStats>& got, const std::vector<SpanRow>& spans, const std::string& what) {
    const auto want = brute_force_groups(spans);
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < got.size(); ++i) {
        const SpanStats& g = got[i];
        const auto it = want.find({g.name, int(g.category)});
        ASSERT_NE(it, want.end()) << what << ": unexpected group " << g.name;
        EXPECT_EQ(g.count, it->second.count) << what << " " << g.name;
        EXPECT_EQ(g.total_ns, it->second.total) << what << " " << g.name;
        EXPECT_EQ(g.self_ns, it->second.self) << what << " " << g.name;
        EXPECT_EQ(g.min_ns, it->second.min) << what << " " << g.name;
        EXPECT_EQ(g.max_ns, it->second.max) << what << " " << g.name;
        if (i > 0) {
            EXPECT_GE(got[i - 1].self_ns, g.self_ns) << what << ": not by self time";
        }
    }
}

std::vector<SpanRow> of_category(const std::vector<SpanRow>& s, SpanCategory c) {
    std::vector<SpanRow> out;
    for (const auto& x : s)
        if (x.category == c) out.push_back(x);
    return out;
}

// ---- random span trees --------------------------------------------------------------------
struct Pool {
    const char* name;
    SpanCategory category;
};
const Pool kOps[] = {
    {"chunk", SpanCategory::CHUNK},  {"attention", SpanCategory::ATTENTION}, {"mlp", SpanCategory::MLP},
    {"rmsnorm", SpanCategory::NORM}, {"policy pass", SpanCategory::RUN},     {"telemetry", SpanCategory::RUN},
    {"load", SpanCategory::RUN},     {"attention", SpanCategory::OTHER},     {"cache update", SpanCategory::CACHE_UPDATE}};

// Emits a tree inside [b, e] in post-order (children written before their parent, as scopes
// close): children are disjoint, may touch, may be empty, may fill the parent exactly.
void emit_tree(std::mt19937_64& rng, int64_t b, int64_t e, int depth, const Pool& self) {
    std::uniform_int_distribution<int> kids(0, depth > 4 ? 0 : 3), pick(0, int(std::size(kOps)) - 1), coin(0, 9);
    const int n = kids(rng);
    int64_t at = b;
    for (int k = 0; k < n && at <= e; ++k) {
        std::uniform_int_distribution<int64_t> gap(0, std::max<int64_t>(0, (e - at) / 4));
        const int c = coin(rng);
        int64_t cb = c < 3 ? at : at + gap(rng);  // often touching the previous sibling
        int64_t ce = std::min(e, cb + (c == 0 ? 0 : gap(rng) + 1));
        if (c == 9 && k == 0) cb = b, ce = e;  // the same interval as its parent
        if (cb > e) break;
        emit_tree(rng, cb, ce, depth + 1, kOps[pick(rng)]);
        at = ce;
    }
    // Layers as the driver tags them, or none (-1): the per-layer summary groups by this tag.
    std::uniform_int_distribution<int32_t> layer(-1, 3);
    trace::span_complete(self.category, trace::Name(self.name), uint64_t(b), uint64_t(e), {.layer = layer(rng)});
}

struct RandomSession {
    test::ScratchDir dir;
    std::string path = dir.file("random.kvlab");
    int64_t run = 0;
    explicit RandomSession(uint64_t seed) {
        auto session = storage::Session::create(path);
        run = session->create_run("random spans", R"({"mode":"eval_long"})");
        session->start_run(run);
        trace::Recorder rec;
        {
            storage::SessionWriter writer(path);
            writer.attach(run, rec);
            const int64_t base = 1'000'000'000;
            std::vector<std::thread> threads;
            for (int t = 0; t < 3; ++t)
                threads.emplace_back([&, t] {
                    trace::RecorderScope scope(rec);
                    std::mt19937_64 rng(seed * 31 + uint64_t(t));
                    // Thread 0 holds the run span over phases; the others only ops.
                    if (t == 0)
                        emit_tree(rng, base, base + 5'000'000, 0, {"run", SpanCategory::RUN});
                    else
                        for (int r = 0; r < 4; ++r)
                            emit_tree(rng, base + r * 1'000'000, base + r * 1'000'000 + 900'000, 1, kOps[r]);
                });
            for (auto& th : threads) th.join();
            writer.detach(run);
        }
        session->finish_run(run, storage::RunStatus::DONE);
    }
};

TEST(SpanSummary, RandomTreesMatchABruteForceParentSearch) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        RandomSession s(seed);
        storage::SessionReader reader(s.path);
        const auto spans = reader.spans(s.run);
        ASSERT_GT(spans.size(), 8u);
        const SpanSummary sum = storage::span_summary(reader, s.run);
        expect_matches(sum.spans, spans, "seed " + std::to_string(seed));
        // Per category: the brute-force self times summed by category.
        std::map<int, std::pair<int64_t, int64_t>> by_category;  // total, self
        const auto self_each = brute_force_self(spans);
        for (size_t i = 0; i < spans.size(); ++i) {
            by_category[int(spans[i].category)].first += spans[i].end_ns - spans[i].start_ns;
            by_category[int(spans[i].category)].second += self_each[i];
        }
        ASSERT_EQ(sum.categories.size(), by_category.size());
        for (const auto& c : sum.categories) {
            EXPECT_EQ(c.total_ns, by_category.at(int(c.category)).first) << trace::span_category_name(c.category);
            EXPECT_EQ(c.self_ns, by_category.at(int(c.category)).second) << trace::span_category_name(c.category);
        }
        // Per layer: the brute-force self times of the spans tagged with it, summed.
        std::map<int32_t, Ref> by_layer;
        for (size_t i = 0; i < spans.size(); ++i) {
            if (spans[i].layer < 0) continue;
            Ref& r = by_layer[spans[i].layer];
            const int64_t d = spans[i].end_ns - spans[i].start_ns;
            ++r.count;
            r.total += d;
            r.self += self_each[i];
            r.min = std::min(r.min, d);
            r.max = std::max(r.max, d);
        }
        ASSERT_EQ(sum.layers.size(), by_layer.size());
        ASSERT_GE(sum.layers.size(), 2u);
        for (size_t i = 0; i < sum.layers.size(); ++i) {
            const auto& l = sum.layers[i];
            if (i > 0) {
                EXPECT_LT(sum.layers[i - 1].layer, l.layer);
            }
            const Ref& r = by_layer.at(l.layer);
            EXPECT_EQ(l.count, r.count) << "layer " << l.layer;
            EXPECT_EQ(l.total_ns, r.total) << "layer " << l.layer;
            EXPECT_EQ(l.self_ns, r.self) << "layer " << l.layer;
            EXPECT_EQ(l.min_ns, r.min) << "layer " << l.layer;
            EXPECT_EQ(l.max_ns, r.max) << "layer " << l.layer;
        }
        // Phases: RUN spans nested among themselves only.
        const auto run_spans = of_category(spans, SpanCategory::RUN);
        expect_matches(sum.phases, run_spans, "phases, seed " + std::to_string(seed));
        const auto ref = brute_force_groups(run_spans);
        EXPECT_EQ(sum.run_ns, ref.at({"run", int(SpanCategory::RUN)}).total);
        EXPECT_EQ(sum.unattributed_ns, ref.at({"run", int(SpanCategory::RUN)}).self);
        // Self times partition the busy time: on each thread they add up to the roots' durations.
        int64_t self_sum = 0, roots = 0;
        const auto self = brute_force_self(spans);
        for (size_t i = 0; i < spans.size(); ++i) self_sum += self[i];
        for (const auto& a : spans) {
            bool inside = false;
            for (const auto& b : spans)
                inside |= &a != &b && a.thread == b.thread && b.start_ns <= a.start_ns && b.end_ns >= a.end_ns &&
                          (b.start_ns != a.start_ns || b.end_ns != a.end_ns || b.id > a.id);
            if (!inside) roots += a.end_ns - a.start_ns;
        }
        EXPECT_EQ(self_sum, roots);
    }
}

TEST(SpanSummary, AWindowSummarizesTheClippedSpans) {
    RandomSession s(7);
    storage::SessionReader reader(s.path);
    const storage::TimeWindow w{1'000'000'000 + 1'234'567, 1'000'000'000 + 3'456'789};
    std::vector<SpanRow> clipped;
    for (SpanRow r : reader.spans(s.run)) {
        const bool zero = r.start_ns == r.end_ns;
        if (zero ? (r.start_ns < w.t0_ns || r.start_ns >= w.t1_ns) : (r.end_ns <= w.t0_ns || r.start_ns >= w.t1_ns)) continue;
        r.start_ns = std::max(r.start_ns, w.t0_ns);
        r.end_ns = std::min(r.end_ns, w.t1_ns);
        clipped.push_back(r);
    }
    ASSERT_GT(clipped.size(), 4u);
    expect_matches(storage::span_summary(reader, s.run, w).spans, clipped, "window");
}

// ---- the named queries ----------------------------------------------------------------------
double cell(const storage::QueryValue& v) {
    if (const auto* i = std::get_if<int64_t>(&v)) return double(*i);
    if (const auto* d = std::get_if<double>(&v)) return *d;
    return NAN;
}
std::string text(const storage::QueryValue& v) {
    return storage::query_value_text(v);
}
size_t col(const storage::QueryResult& r, const std::string& name) {
    const auto it = std::find(r.columns.begin(), r.columns.end(), name);
    EXPECT_NE(it, r.columns.end()) << name;
    return size_t(it - r.columns.begin());
}

// top-spans (SQL) and phases (SQL) row for row equal to span_summary.
void expect_sql_equals_summary(const std::string& path, int64_t run) {
    storage::SessionReader reader(path);
    const SpanSummary sum = storage::span_summary(reader, run);
    const auto top = storage::session_query(path, storage::find_named_query("top-spans")->sql, {{"run", std::to_string(run)}});
    ASSERT_EQ(top.rows.size(), sum.spans.size());
    std::map<std::pair<std::string, std::string>, const SpanStats*> by_key;
    for (const auto& g : sum.spans) by_key[{g.name, trace::span_category_name(g.category)}] = &g;
    for (const auto& row : top.rows) {
        const auto it = by_key.find({text(row[col(top, "name")]), text(row[col(top, "category")])});
        ASSERT_NE(it, by_key.end()) << text(row[0]);
        const SpanStats& g = *it->second;
        EXPECT_EQ(cell(row[col(top, "count")]), double(g.count)) << g.name;
        EXPECT_EQ(cell(row[col(top, "total_ms")]), double(g.total_ns) / 1e6) << g.name;
        EXPECT_EQ(cell(row[col(top, "self_ms")]), double(g.self_ns) / 1e6) << g.name;
        EXPECT_EQ(cell(row[col(top, "min_ms")]), double(g.min_ns) / 1e6) << g.name;
        EXPECT_EQ(cell(row[col(top, "max_ms")]), double(g.max_ns) / 1e6) << g.name;
        EXPECT_NEAR(cell(row[col(top, "mean_ms")]), g.mean_ns() / 1e6, 1e-9 * (1 + g.mean_ns() / 1e6)) << g.name;
    }
    const auto cats =
        storage::session_query(path, storage::find_named_query("span-categories")->sql, {{"run", std::to_string(run)}});
    ASSERT_EQ(cats.rows.size(), sum.categories.size());
    for (size_t i = 0; i < cats.rows.size(); ++i) {
        EXPECT_EQ(text(cats.rows[i][col(cats, "category")]), trace::span_category_name(sum.categories[i].category));
        EXPECT_EQ(cell(cats.rows[i][col(cats, "count")]), double(sum.categories[i].count));
        EXPECT_EQ(cell(cats.rows[i][col(cats, "total_ms")]), double(sum.categories[i].total_ns) / 1e6);
        EXPECT_EQ(cell(cats.rows[i][col(cats, "self_ms")]), double(sum.categories[i].self_ns) / 1e6);
    }
    const auto lay = storage::session_query(path, storage::find_named_query("span-layers")->sql, {{"run", std::to_string(run)}});
    ASSERT_EQ(lay.rows.size(), sum.layers.size());
    for (size_t i = 0; i < lay.rows.size(); ++i) {
        EXPECT_EQ(cell(lay.rows[i][col(lay, "layer")]), double(sum.layers[i].layer));
        EXPECT_EQ(cell(lay.rows[i][col(lay, "count")]), double(sum.layers[i].count));
        EXPECT_EQ(cell(lay.rows[i][col(lay, "total_ms")]), double(sum.layers[i].total_ns) / 1e6);
        EXPECT_EQ(cell(lay.rows[i][col(lay, "self_ms")]), double(sum.layers[i].self_ns) / 1e6) << "layer " << sum.layers[i].layer;
    }
    const auto limited = storage::session_query(path, storage::find_named_query("top-spans")->sql,
                                                {{"run", std::to_string(run)}, {"limit", "3"}});
    EXPECT_EQ(limited.rows.size(), std::min<size_t>(3, sum.spans.size()));
    const auto ph = storage::session_query(path, storage::find_named_query("phases")->sql, {{"run", std::to_string(run)}});
    ASSERT_EQ(ph.rows.size(), sum.phases.size());
    for (size_t i = 0; i < ph.rows.size(); ++i) {
        EXPECT_EQ(text(ph.rows[i][col(ph, "phase")]), sum.phases[i].name);
        EXPECT_EQ(cell(ph.rows[i][col(ph, "self_ms")]), double(sum.phases[i].self_ns) / 1e6) << sum.phases[i].name;
        EXPECT_EQ(cell(ph.rows[i][col(ph, "total_ms")]), double(sum.phases[i].total_ns) / 1e6) << sum.phases[i].name;
    }
}

TEST(NamedQueries, TopSpansAndPhasesEqualTheSpanSummaryOnRandomTrees) {
    for (uint64_t seed = 11; seed <= 14; ++seed) {
        RandomSession s(seed);
        SCOPED_TRACE("seed " + std::to_string(seed));
        expect_sql_equals_summary(s.path, s.run);
    }
}

TEST(NamedQueries, EveryNameIsUniqueAndDocumented) {
    const std::string doc = test::read_file_bytes(KVLAB_SOURCE_DIR "/docs/SESSIONS.md");
    std::set<std::string> names;
    for (const auto& q : storage::named_queries()) {
        EXPECT_TRUE(names.insert(q.name).second) << q.name;
        EXPECT_EQ(q.name.find(' '), std::string::npos) << q.name;
        EXPECT_FALSE(q.description.empty()) << q.name;
        EXPECT_NE(doc.find("`" + q.name + "`"), std::string::npos) << q.name << " is not documented in docs/SESSIONS.md";
    }
    EXPECT_EQ(storage::find_named_query("no-such-query"), nullptr);
}

TEST(SqlQuery, StatementsThatWriteAreRefusedAndTheFileIsUntouched) {
    RandomSession s(3);
    storage::Session::open(s.path)->checkpoint();
    const std::string before = test::read_file_bytes(s.path);
    for (const char* sql :
         {"DELETE FROM runs", "UPDATE runs SET name = 'x'", "CREATE TABLE x(a)", "DROP TABLE spans",
          "INSERT INTO metrics(run_id, name) VALUES(1, 'x')", "PRAGMA user_version = 9", "CREATE TEMP TABLE t(a)"}) {
        try {
            storage::session_query(s.path, sql);
            ADD_FAILURE() << sql << " was not refused";
        } catch (const storage::SessionError& e) {
            EXPECT_EQ(e.kind(), storage::SessionErrorKind::INVALID) << sql;
            EXPECT_NE(std::string(e.what()).find("only reads"), std::string::npos) << sql << ": " << e.what();
        }
    }
    EXPECT_EQ(test::read_file_bytes(s.path), before);
    EXPECT_EQ(storage::session_query(s.path, "SELECT count(*) AS n FROM runs").rows.at(0).at(0),
              storage::QueryValue{int64_t(1)});
    for (const char* bad : {"SELECT 1; SELECT 2", "SELEC 1", "", "SELECT ?"})
        EXPECT_THROW(storage::session_query(s.path, bad), storage::SessionError) << bad;
    try {
        storage::session_query(s.path, storage::find_named_query("metrics")->sql, {}, {"run"});
        ADD_FAILURE() << "a missing required parameter was accepted";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find(":run"), std::string::npos) << e.what();
    }
}

TEST(QueryResult, FormatsKeepEveryCell) {
    storage::QueryResult r;
    r.columns = {"name", "n", "x"};
    r.rows = {{std::string("a, \"b\""), int64_t(3), 0.1}, {std::monostate{}, int64_t(-4), 2.5e10}};
    EXPECT_EQ(storage::format_query_result(r, storage::ResultFormat::CSV),
              "name,n,x\n\"a, \"\"b\"\"\",3,0.10000000000000001\n,-4,25000000000\n");
    const auto j = nlohmann::json::parse(storage::format_query_result(r, storage::ResultFormat::JSON));
    EXPECT_EQ(j[0]["name"], "a, \"b\"");
    EXPECT_EQ(j[0]["x"].get<double>(), 0.1);
    EXPECT_TRUE(j[1]["name"].is_null());
    const std::string t = storage::format_query_result(r, storage::ResultFormat::TABLE);
    // Widths: "a, \"b\"" (6), "-4" (2), "2.5e+10" (7); numbers right-aligned, NULL blank.
    EXPECT_EQ(t, "name     n        x\n------  --  -------\na, \"b\"   3      0.1\n        -4  2.5e+10\n");
    const std::string md = storage::format_query_result(r, storage::ResultFormat::MARKDOWN);
    EXPECT_EQ(md.substr(0, md.find('\n')), "| name   |  n |       x |");
}

// ---- run diffs ------------------------------------------------------------------------------
TEST(RunDiff, ARunAgainstItselfIsAllZeros) {
    RandomSession s(5);
    storage::SessionReader reader(s.path);
    const auto d = storage::run_diff(reader, s.run, s.run);
    ASSERT_FALSE(d.rows.empty());
    for (const auto& r : d.rows) {
        EXPECT_NE(r.section, "summary") << r.name << " differs from itself";
        EXPECT_EQ(r.count_a, r.count_b) << r.name;
        if (!std::isnan(r.a)) {
            EXPECT_EQ(r.b_minus_a(), 0.0) << r.name;
            if (r.a != 0) {
                EXPECT_EQ(r.b_over_a(), 1.0) << r.name;
            }
        }
    }
    EXPECT_THROW(storage::run_diff(reader, s.run, 99), storage::SessionError);
}

// ---- a real tiny run ----------------------------------------------------------------------
class RecordedSweep : public ::testing::Test {
 protected:
    static void SetUpTestSuite() {
        dir_ = new test::ScratchDir;
        path_ = dir_->file("sweep.kvlab");
        const std::string kvlab = KVLAB_BINARY_DIR "/bin/kvlab";
        if (!std::filesystem::exists(kvlab)) return;
        const std::string cmd = kvlab +
                                " sweep tiny --data repeat --data.repeat_length 16 --data.repeat_distance 64 "
                                "--data.seq_length 256 --data.num_samples 2 --kv_cache.name h2o --kv_cache.cache_length 64,128 "
                                "--kv_cache.chunk_size 16 --threads 1 --figure none --session " +
                                path_ + " > " + dir_->file("sweep.out") + " 2>&1";
        recorded_ = std::system(cmd.c_str()) == 0;
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    void SetUp() override {
        if (!std::filesystem::exists(KVLAB_BINARY_DIR "/bin/kvlab")) GTEST_SKIP() << "the kvlab CLI is not built";
        ASSERT_TRUE(recorded_) << test::read_file_bytes(dir_->file("sweep.out"));
    }
    static inline test::ScratchDir* dir_ = nullptr;
    static inline std::string path_;
    static inline bool recorded_ = false;
};

TEST_F(RecordedSweep, SummariesMatchTheBruteForceAndThePhaseClocks) {
    storage::SessionReader reader(path_);
    const auto runs = reader.runs();
    ASSERT_EQ(runs.size(), 3u);
    for (const auto& r : runs) {
        SCOPED_TRACE("run " + std::to_string(r.id));
        const auto spans = reader.spans(r.id);
        ASSERT_GT(spans.size(), 50u);
        const SpanSummary sum = storage::span_summary(reader, r.id);
        expect_matches(sum.spans, spans, "run " + std::to_string(r.id));
        expect_matches(sum.phases, of_category(spans, SpanCategory::RUN), "phases");
        expect_sql_equals_summary(path_, r.id);
        // The engine's phase clocks (summary phase_seconds) measure what the phase spans do.
        const auto summary = nlohmann::json::parse(r.summary);
        ASSERT_TRUE(summary.contains("phase_seconds"));
        for (auto it = summary["phase_seconds"].begin(); it != summary["phase_seconds"].end(); ++it) {
            const auto p =
                std::find_if(sum.phases.begin(), sum.phases.end(), [&](const SpanStats& g) { return g.name == it.key(); });
            ASSERT_NE(p, sum.phases.end()) << it.key();
            EXPECT_NEAR(double(p->self_ns) / 1e9, it->get<double>(), 1e-5 + 0.01 * it->get<double>()) << it.key();
        }
        EXPECT_GT(sum.run_ns, 0);
        EXPECT_GE(sum.unattributed_ns, 0);
        EXPECT_LT(sum.unattributed_ns, sum.run_ns);
    }
}

TEST_F(RecordedSweep, EveryNamedQueryRunsAndReadsWhatTheTablesHold) {
    for (const auto& q : storage::named_queries()) {
        SCOPED_TRACE(q.name);
        const auto r = storage::session_query(path_, q.sql, {{"run", "2"}});
        EXPECT_FALSE(r.rows.empty());
    }
    const auto runs = storage::session_query(path_, storage::find_named_query("runs")->sql);
    ASSERT_EQ(runs.rows.size(), 3u);
    EXPECT_EQ(text(runs.rows[1][col(runs, "policy")]), "h2o-default");
    EXPECT_EQ(cell(runs.rows[1][col(runs, "cache_length")]), 64);
    EXPECT_EQ(text(runs.rows[1][col(runs, "task")]), "repeat");
    for (const auto& row : runs.rows) {
        const auto summary = nlohmann::json::parse(storage::SessionReader(path_).run(int64_t(cell(row[0]))).summary);
        EXPECT_EQ(cell(row[col(runs, "peak_bytes")]), summary["peak_bytes_without_instrumentation"]["cpu"].get<double>());
        EXPECT_EQ(cell(row[col(runs, "tokens_per_s")]), summary["tokens_per_s"].get<double>());
    }
    // Memory: the peak of each category equals the largest running total among its events.
    storage::SessionReader reader(path_);
    std::map<std::string, int64_t> peak;
    for (const auto& e : reader.memory_events(2)) {
        int64_t& p = peak[mem_category_name(e.category)];
        p = std::max(p, e.category_total);
    }
    const auto mem = storage::session_query(path_, storage::find_named_query("memory-by-category")->sql, {{"run", "2"}});
    ASSERT_EQ(mem.rows.size(), peak.size());
    for (const auto& row : mem.rows)
        EXPECT_EQ(cell(row[col(mem, "peak_bytes")]), double(peak.at(text(row[col(mem, "category")]))));
    // Evictions: a cache of 64 slots takes each sample's 256 tokens, so every layer evicts
    // 256 - 64 of them per sample; the tiny model has 2 layers.
    const auto ev = storage::session_query(path_, storage::find_named_query("evictions-per-chunk")->sql, {{"run", "2"}});
    std::map<double, double> evicted_by_sample;
    for (const auto& row : ev.rows) {
        evicted_by_sample[cell(row[col(ev, "sample")])] += cell(row[col(ev, "evicted")]);
        EXPECT_EQ(cell(row[col(ev, "layers")]), 2);
    }
    EXPECT_EQ(evicted_by_sample, (std::map<double, double>{{0, (256 - 64) * 2}, {1, (256 - 64) * 2}}));
    // Metrics: count and last value per name as stored.
    const auto m = storage::session_query(path_, storage::find_named_query("metrics")->sql, {{"run", "2"}});
    for (const auto& row : m.rows) {
        const auto stored = reader.metrics(2, text(row[0]));
        ASSERT_FALSE(stored.empty());
        EXPECT_EQ(cell(row[col(m, "count")]), double(stored.size()));
        EXPECT_EQ(cell(row[col(m, "last")]), stored.back().value);
    }
}

TEST_F(RecordedSweep, DiffIsTheDifferenceOfIndependentSums) {
    storage::SessionReader reader(path_);
    const auto d = storage::run_diff(reader, 2, 3);
    // Span totals and counts by plain SQL, not through span_summary.
    auto totals = [&](int64_t run) {
        std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> out;
        const auto r = storage::session_query(
            path_,
            "SELECT n.value, c.name, count(*), sum(end_ns - start_ns) FROM spans s JOIN StringIds n ON n.id = s.name_id "
            "JOIN ENUM_KVLAB_SPAN_CATEGORY c ON c.id = s.category WHERE run_id = :run GROUP BY 1, 2",
            {{"run", std::to_string(run)}});
        for (const auto& row : r.rows) out[{text(row[0]), text(row[1])}] = {int64_t(cell(row[2])), int64_t(cell(row[3]))};
        return out;
    };
    const auto ta = totals(2), tb = totals(3);
    const auto sa = nlohmann::json::parse(reader.run(2).summary), sb = nlohmann::json::parse(reader.run(3).summary);
    size_t spans = 0, memory = 0;
    double last_abs = INFINITY;
    for (const auto& r : d.rows) {
        if (r.section == "spans") {
            ++spans;
            const auto key = std::make_pair(r.name, r.detail);
            const auto a = ta.count(key) ? ta.at(key) : std::make_pair(int64_t(0), int64_t(0));
            const auto b = tb.count(key) ? tb.at(key) : std::make_pair(int64_t(0), int64_t(0));
            EXPECT_EQ(r.count_a, a.first) << r.name;
            EXPECT_EQ(r.count_b, b.first) << r.name;
            EXPECT_EQ(r.a, double(a.second) / 1e6) << r.name;
            EXPECT_EQ(r.b, double(b.second) / 1e6) << r.name;
            EXPECT_LE(std::fabs(r.b_minus_a()), last_abs) << "spans not sorted by |B - A|";
            last_abs = std::fabs(r.b_minus_a());
        } else if (r.section == "memory") {
            ++memory;
            const bool with = r.detail.find("instrumentation") != std::string::npos;
            const char* key = with ? "peak_bytes_by_category" : "peak_bytes_by_category_without_instrumentation";
            EXPECT_EQ(r.a, sa[key]["cpu"][r.name].get<double>()) << r.name;
            EXPECT_EQ(r.b, sb[key]["cpu"][r.name].get<double>()) << r.name;
        } else if (r.section == "summary") {
            EXPECT_NE(r.a, r.b) << r.name;
        }
    }
    std::set<std::pair<std::string, std::string>> names;
    for (const auto& [k, v] : ta) names.insert(k);
    for (const auto& [k, v] : tb) names.insert(k);
    EXPECT_EQ(spans, names.size());
    EXPECT_EQ(memory, sa["peak_bytes_by_category"]["cpu"].size() * 2);
    // A summary number that differs is listed: the KV bytes of 64 vs 128 slots.
    EXPECT_TRUE(std::any_of(d.rows.begin(), d.rows.end(), [](const storage::RunDiffRow& r) {
        return r.section == "summary" && r.name == "kv_bytes" && r.b == 2 * r.a;
    }));
}

// A session written by an older kvlab (schema 1: no block tables, no sample_tokens) is read
// after the read-write open migrates it, with the same answers.
TEST_F(RecordedSweep, NamedQueriesAnswerTheSameOnAMigratedSchemaOneFile) {
    const std::string old = dir_->file("old.kvlab");
    storage::Session::open(path_)->checkpoint();
    std::filesystem::copy_file(path_, old);
    std::map<std::string, std::string> before;
    for (const auto& q : storage::named_queries())
        before[q.name] =
            storage::format_query_result(storage::session_query(path_, q.sql, {{"run", "3"}}), storage::ResultFormat::CSV);
    {
        storage::Db db(old, SQLITE_OPEN_READWRITE);
        db.exec(
            "DROP TABLE span_blocks; DROP TABLE memory_blocks; DROP TABLE sample_tokens;"
            "CREATE INDEX spans_window ON spans(run_id, dur_class, start_ns);"
            "CREATE INDEX memory_events_time ON memory_events(run_id, t_ns);"
            "PRAGMA user_version=1; UPDATE meta SET value='1' WHERE key='schema_version';",
            "t");
    }
    try {
        storage::session_query(old, "SELECT 1");
        ADD_FAILURE() << "a read-only query of a schema-1 file must ask for the upgrade";
    } catch (const storage::SessionError& e) {
        EXPECT_NE(std::string(e.what()).find("schema version 1"), std::string::npos) << e.what();
    }
    storage::Session::open(old);  // read-write: migrates
    for (const auto& q : storage::named_queries())
        EXPECT_EQ(storage::format_query_result(storage::session_query(old, q.sql, {{"run", "3"}}), storage::ResultFormat::CSV),
                  before[q.name])
            << q.name;
}

}  // namespace
}  // namespace kv
