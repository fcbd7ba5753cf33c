// Diff view: two recorded tiny runs (h2o and lastrec, same data and chunks) read through the
// canvas; every section is checked against a reference computed here from the reader's rows
// (span totals and counts by plain sums, chunk memory peaks by a scan, kept slots by replaying
// the hand-decoded plans), so the in-app diff is the difference of the two runs' summaries, and
// a run against itself is all zeros. The diff is computed on a worker: frames drawn while it
// is held return at once, and what it swaps in equals the diff computed here.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <set>
#include <tuple>

#include "storage/session_reader.h"
#include "views/canvas_impl.h"
#include "views/diff_view.h"
#include "views/view_table.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

using storage::RunDiffRow;

// Per layer: (step, row, position) triples held after each pass-0 step, by replaying the plans
// onto slot tables -- moves read the old table, then new token t goes to slot targets[r * n + t].
// A new sample (input_pos 0) starts empty; a plan with one row applies to every row.
struct Held {
    std::vector<std::vector<std::set<int64_t>>> steps;  // [step][row] -> positions
    std::vector<std::pair<int64_t, int64_t>> ends;       // [step] -> (sample, tokens processed)
};
std::map<int, Held> held_per_layer(storage::SessionReader& r, int64_t run) {
    auto rows = r.cache_steps(run, -1);
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    std::map<int, std::vector<std::map<int32_t, int64_t>>> tables;  // layer -> row -> slot -> position
    std::map<int, Held> out;
    std::map<int, int64_t> sample;
    for (const auto& row : rows) {
        if (row.pass != 0) continue;
        const SlotPlan p = test::hand_decode(row.replay_log);
        if (!sample.count(row.layer)) sample[row.layer] = -1;
        if (p.input_pos == 0) ++sample[row.layer];
        auto& t = tables[row.layer];
        if (p.input_pos == 0) t.assign(std::max<size_t>(t.size(), 1), {});
        if (int64_t(t.size()) < p.rows) t.resize(size_t(p.rows), t[0]);
        for (size_t rr = 0; rr < t.size(); ++rr) {
            const int64_t pr = p.rows == 1 ? 0 : int64_t(rr);
            const auto old = t[rr];
            for (int64_t m = 0; m < p.moves; ++m) {
                const auto it = old.find(p.move_from[size_t(pr * p.moves + m)]);
                if (it == old.end()) t[rr].erase(p.move_to[size_t(pr * p.moves + m)]);
                else t[rr][p.move_to[size_t(pr * p.moves + m)]] = it->second;
            }
            for (int64_t k = 0; k < p.n; ++k) t[rr][p.targets[size_t(pr * p.n + k)]] = p.input_pos + k;
        }
        std::vector<std::set<int64_t>> now;
        for (const auto& tr : t) {
            std::set<int64_t> pos;
            for (const auto& [slot, x] : tr) pos.insert(x);
            now.push_back(pos);
        }
        out[row.layer].steps.push_back(now);
        out[row.layer].ends.emplace_back(sample[row.layer], p.input_pos + p.n);
    }
    return out;
}

struct KeptRef {
    int64_t steps = 0, a = 0, b = 0, both = 0, unmatched = 0;
};
// Steps of the two runs compared where they end at the same token of the same sample.
KeptRef kept_reference(const Held& a, const Held& b) {
    KeptRef k;
    for (size_t i = 0; i < a.steps.size(); ++i) {
        size_t j = 0;
        while (j < b.ends.size() && b.ends[j] != a.ends[i]) ++j;
        if (j == b.ends.size()) {
            ++k.unmatched;
            continue;
        }
        ++k.steps;
        const size_t rows = std::max(a.steps[i].size(), b.steps[j].size());
        for (size_t r = 0; r < rows; ++r) {
            const auto& x = a.steps[i][std::min(r, a.steps[i].size() - 1)];
            const auto& y = b.steps[j][std::min(r, b.steps[j].size() - 1)];
            k.a += int64_t(x.size()), k.b += int64_t(y.size());
            for (int64_t p : x) k.both += y.count(p);
        }
    }
    k.unmatched += int64_t(b.steps.size()) - k.steps;
    return k;
}

// Span totals and counts per (name, category name) by plain sums over the rows.
std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> span_sums(storage::SessionReader& r, int64_t run) {
    std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> out;
    for (const auto& s : r.spans(run)) {
        auto& v = out[{s.name, trace::span_category_name(s.category)}];
        ++v.first;
        v.second += s.end_ns - s.start_ns;
    }
    return out;
}

class DiffViewRecorded : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("diff.kvlab");
        runs_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 64, 256, 2, 16),
                                               test::tiny_eval_config("lastrec-default", 64, 256, 2, 16),
                                               test::tiny_eval_config("lastrec-default", 64, 256, 2, 48)});
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static inline test::ViewsScratchDir* dir_ = nullptr;
    static inline std::string path_;
    static inline std::vector<int64_t> runs_;
};

TEST_F(DiffViewRecorded, EqualsTheDifferenceOfTheRunsSummaries) {
    ASSERT_EQ(runs_.size(), 3u);
    test::ImGuiHarness h(1280, 800);
    Canvas canvas(nullptr);
    canvas.open_session(path_);
    canvas.select_runs({runs_[0], runs_[1]});
    canvas.set_view(view_named("diff"));
    // The diff is read on a worker: the host serves the view's draw requests after each frame
    // until it is swapped in.
    canvas.refresh();
    for (int i = 0; i < 100'000 && canvas.has_draw_requests(); ++i) canvas.serve_draw_requests();
    DiffViewState& s = canvas.impl().state<DiffViewState>();
    ASSERT_EQ(s.error, "");
    ASSERT_TRUE(s.have_diff);
    EXPECT_TRUE(s.settled) << "both runs ended";
    ASSERT_EQ(s.run_a, runs_[0]) << "A is the reference (the first selected run)";
    ASSERT_EQ(s.run_b, runs_[1]);

    storage::SessionReader reader(path_);
    const auto ta = span_sums(reader, runs_[0]), tb = span_sums(reader, runs_[1]);
    std::set<std::pair<std::string, std::string>> span_keys;
    for (const auto& m : {ta, tb})
        for (const auto& [k, v] : m) span_keys.insert(k);
    // Chunk peaks: the largest category total among each chunk's events.
    std::map<std::tuple<std::string, std::string, std::string>, int64_t> chunk_a, chunk_b;
    for (auto [run, out] : {std::pair{runs_[0], &chunk_a}, std::pair{runs_[1], &chunk_b}})
        for (const auto& e : reader.memory_events(run))
            if (e.chunk >= 0) {
                int64_t& p = (*out)[{mem_category_name(e.category), trace::device_code_name(e.device), std::to_string(e.chunk)}];
                p = std::max(p, e.category_total);
            }
    const auto held_a = held_per_layer(reader, runs_[0]), held_b = held_per_layer(reader, runs_[1]);
    ASSERT_EQ(held_a.size(), 2u) << "the tiny model has 2 layers";

    size_t spans = 0, chunks = 0, kept = 0;
    bool some_kept_differ = false;
    for (const RunDiffRow& r : s.diff.rows) {
        SCOPED_TRACE(r.section + " " + r.name + " " + r.detail + " " + r.measure);
        if (r.section == "spans") {
            ++spans;
            const auto key = std::make_pair(r.name, r.detail);
            const auto a = ta.count(key) ? ta.at(key) : std::pair<int64_t, int64_t>{0, 0};
            const auto b = tb.count(key) ? tb.at(key) : std::pair<int64_t, int64_t>{0, 0};
            EXPECT_EQ(r.count_a, a.first);
            EXPECT_EQ(r.count_b, b.first);
            EXPECT_DOUBLE_EQ(r.a, double(a.second) / 1e6);
            EXPECT_DOUBLE_EQ(r.b, double(b.second) / 1e6);
            EXPECT_NEAR(r.b_minus_a(), double(b.second - a.second) / 1e6, 1e-9);
        } else if (r.section == "memory_chunks") {
            ++chunks;
            const std::string chunk = r.detail.substr(r.detail.rfind(' ') + 1), device = r.detail.substr(0, r.detail.find(' '));
            const auto key = std::make_tuple(r.name, device, chunk);
            EXPECT_EQ(r.a, chunk_a.count(key) ? double(chunk_a.at(key)) : r.a) << "A's peak";
            EXPECT_EQ(std::isnan(r.a), !chunk_a.count(key));
            EXPECT_EQ(r.b, chunk_b.count(key) ? double(chunk_b.at(key)) : r.b) << "B's peak";
            EXPECT_EQ(std::isnan(r.b), !chunk_b.count(key));
        } else if (r.section == "kept_slots") {
            ++kept;
            const int layer = std::stoi(r.name.substr(6));
            const KeptRef k = kept_reference(held_a.at(layer), held_b.at(layer));
            EXPECT_EQ(r.count_a, k.steps);
            EXPECT_EQ(k.unmatched, 0) << "same chunks";
            EXPECT_EQ(r.detail, "");
            ASSERT_GT(k.steps, 4);
            if (r.measure == "held") {
                EXPECT_EQ(r.a, double(k.a));
                EXPECT_EQ(r.b, double(k.b));
            } else {
                ASSERT_EQ(r.measure, "kept_by_both");
                EXPECT_DOUBLE_EQ(r.a, double(k.both) / double(k.a));
                EXPECT_DOUBLE_EQ(r.b, double(k.both) / double(k.b));
                some_kept_differ |= k.both < k.a;
            }
        }
    }
    EXPECT_EQ(spans, span_keys.size());
    std::set<std::tuple<std::string, std::string, std::string>> chunk_keys;
    for (const auto& m : {chunk_a, chunk_b})
        for (const auto& [k, v] : m) chunk_keys.insert(k);
    EXPECT_GT(chunk_keys.size(), 8u);
    EXPECT_EQ(chunks, chunk_keys.size());
    EXPECT_EQ(kept, 4u) << "held and kept_by_both for each of 2 layers";
    EXPECT_TRUE(some_kept_differ) << "h2o and lastrec keep different tokens";

    // The table: a section and a filter narrow it; each sort column orders the rows.
    s.section = "kept_slots";
    auto shown = diff_rows_shown(s);
    EXPECT_EQ(shown.size(), 4u);
    s.section = "spans";
    std::snprintf(s.filter, sizeof s.filter, "ATTEN");
    shown = diff_rows_shown(s);
    ASSERT_FALSE(shown.empty());
    for (uint32_t i : shown) {
        const auto& r = s.diff.rows[i];
        std::string both = r.name + r.detail;
        std::transform(both.begin(), both.end(), both.begin(), ::tolower);
        EXPECT_NE(both.find("atten"), std::string::npos) << r.name;
    }
    s.filter[0] = 0;
    s.sort = DiffColumn::B_OVER_A, s.descending = false;
    shown = diff_rows_shown(s);
    for (size_t k = 1; k < shown.size(); ++k) {
        const double x = s.diff.rows[shown[k - 1]].b_over_a(), y = s.diff.rows[shown[k]].b_over_a();
        if (!std::isnan(y)) {
            EXPECT_LE(x, y);
        }
    }
    s.section.clear();
    EXPECT_EQ(diff_rows_shown(s).size(), s.diff.rows.size());
    // It draws the table.
    int vertices = 0;
    for (int f = 0; f < 2; ++f) vertices = h.frame([&] { canvas.draw(1280, 800); });
    EXPECT_GT(vertices, 1000);
}

// Chunks of 48 against 16: the steps line up at every third chunk of 16 (48, 96, ... tokens of
// each sample); the others are replayed alone and counted as unmatched.
TEST_F(DiffViewRecorded, KeptSlotsOfDifferentChunkingsCompareWhereTheStepsLineUp) {
    storage::SessionReader reader(path_);
    DiffViewState s;
    diff_select(s, runs_[0], runs_[2]);
    ASSERT_TRUE(refresh_diff_view(s, reader));
    ASSERT_TRUE(diff_wait(s));
    ASSERT_EQ(s.error, "");
    const auto held_a = held_per_layer(reader, runs_[0]), held_b = held_per_layer(reader, runs_[2]);
    size_t kept = 0;
    for (const RunDiffRow& r : s.diff.rows) {
        if (r.section != "kept_slots") continue;
        ++kept;
        SCOPED_TRACE(r.name + " " + r.measure);
        const KeptRef k = kept_reference(held_a.at(std::stoi(r.name.substr(6))), held_b.at(std::stoi(r.name.substr(6))));
        EXPECT_GT(k.steps, 2);
        EXPECT_GT(k.unmatched, 0);
        EXPECT_EQ(r.count_a, k.steps);
        if (r.measure == "held") {
            EXPECT_EQ(r.a, double(k.a));
            EXPECT_EQ(r.b, double(k.b));
            EXPECT_EQ(r.detail, std::to_string(k.unmatched) + " steps end where the other run has none");
        } else {
            EXPECT_DOUBLE_EQ(r.a, double(k.both) / double(k.a));
            EXPECT_DOUBLE_EQ(r.b, double(k.both) / double(k.b));
        }
    }
    EXPECT_EQ(kept, 4u);
}

TEST_F(DiffViewRecorded, ARunAgainstItselfIsAllZeros) {
    storage::SessionReader reader(path_);
    DiffViewState s;
    diff_select(s, runs_[0], runs_[0]);
    ASSERT_TRUE(refresh_diff_view(s, reader));
    ASSERT_TRUE(diff_wait(s));
    ASSERT_EQ(s.error, "");
    EXPECT_FALSE(refresh_diff_view(s, reader)) << "a settled diff is not re-read";
    size_t kept = 0;
    for (const RunDiffRow& r : s.diff.rows) {
        SCOPED_TRACE(r.section + " " + r.name + " " + r.detail + " " + r.measure);
        EXPECT_NE(r.section, "summary") << "a summary number differs from itself";
        EXPECT_EQ(r.count_a, r.count_b);
        EXPECT_EQ(r.a, r.b);
        if (!std::isnan(r.a)) {
            EXPECT_EQ(r.b_minus_a(), 0.0);
        }
        if (r.measure == "kept_by_both") {
            ++kept;
            EXPECT_EQ(r.a, 1.0);
        }
    }
    EXPECT_EQ(kept, 2u);
    // An unknown run: one message naming it.
    DiffViewState bad;
    diff_select(bad, runs_[0], 999);
    refresh_diff_view(bad, reader);
    EXPECT_TRUE(diff_wait(bad));
    EXPECT_NE(bad.error.find("999"), std::string::npos) << bad.error;
    // With one run there is nothing to diff: the view asks for a second.
    diff_select(bad, runs_[0], 0);
    EXPECT_FALSE(refresh_diff_view(bad, reader));
    test::ImGuiHarness h(800, 600);
    EXPECT_GT(h.window_frame([&] { DrawDiffView(bad, nullptr, ImVec2(800, 600)); }), 0);
}

// The worker holds at its start until the test lets it go: frames drawn meanwhile return at
// once with the progress shown and no table; once released, the swapped-in diff equals
// storage::run_diff over inputs the test reads itself on this thread.
TEST_F(DiffViewRecorded, FramesDrawWhileTheDiffIsComputed) {
    storage::SessionReader reader(path_);
    DiffViewState s;
    diff_select(s, runs_[0], runs_[1]);
    auto gate = std::make_shared<std::promise<void>>();
    std::shared_future<void> open = gate->get_future().share();
    s.worker_hook = [open] { open.wait(); };
    ASSERT_TRUE(refresh_diff_view(s, reader)) << "starting the worker changes what is drawn";
    EXPECT_TRUE(diff_pending(s));
    test::ImGuiHarness h(1280, 800);
    for (int f = 0; f < 5; ++f) {
        const auto t = std::chrono::steady_clock::now();
        EXPECT_GT(h.window_frame([&] { DrawDiffView(s, nullptr, ImVec2(1280, 800)); }), 0);
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count(), 1.0) << "a frame waited";
        EXPECT_FALSE(refresh_diff_view(s, reader)) << "nothing to swap in yet";
    }
    EXPECT_FALSE(s.have_diff);
    std::string what;
    EXPECT_LT(diff_progress(s, &what), 1.f);
    EXPECT_EQ(what, "opening the session");
    EXPECT_FALSE(diff_wait(s, 0.05)) << "the worker is held";
    gate->set_value();
    ASSERT_TRUE(diff_wait(s));
    EXPECT_FALSE(diff_pending(s));
    ASSERT_EQ(s.error, "");
    ASSERT_TRUE(s.have_diff);
    const storage::RunDiff want = storage::run_diff(storage::read_run_diff_input(reader, runs_[0]), storage::read_run_diff_input(reader, runs_[1]));
    ASSERT_EQ(s.diff.rows.size(), want.rows.size());
    for (size_t i = 0; i < want.rows.size(); ++i) {
        const RunDiffRow &g = s.diff.rows[i], &w = want.rows[i];
        EXPECT_EQ(g.section + g.name + g.detail + g.measure, w.section + w.name + w.detail + w.measure) << i;
        EXPECT_EQ(g.count_a, w.count_a);
        EXPECT_EQ(g.count_b, w.count_b);
        EXPECT_TRUE(g.a == w.a || (std::isnan(g.a) && std::isnan(w.a))) << i;
        EXPECT_TRUE(g.b == w.b || (std::isnan(g.b) && std::isnan(w.b))) << i;
    }
    // A new selection while a worker is held: dropping it stops and joins it.
    diff_select(s, runs_[0], runs_[2]);
    auto gate2 = std::make_shared<std::promise<void>>();
    std::shared_future<void> open2 = gate2->get_future().share();
    s.worker_hook = [open2] { open2.wait(); };
    ASSERT_TRUE(refresh_diff_view(s, reader));
    gate2->set_value();
    diff_select(s, runs_[1], runs_[2]);
    EXPECT_FALSE(diff_pending(s));
}

}  // namespace
}  // namespace kv::views
