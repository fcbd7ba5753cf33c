// Eviction map: images against an independent replay of the recorded replay log, binning rule,
// hit testing and hover details, grace-ring moves, incremental refresh == full reload, damaged
// blobs, and two headless frames with a recording texture host.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <sqlite3.h>

#include "views/colormap.h"
#include "views/eviction_map.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

using test::ImGuiHarness;
using test::RecordingTextureHost;

// Hand replay of one row: the slot table after each step (moves read the table before the
// step, then the new tokens are written).
std::vector<std::vector<int32_t>> hand_replay(const std::vector<SlotPlan>& plans, int64_t row, int64_t L) {
    std::vector<std::vector<int32_t>> out;
    std::vector<int32_t> slots(size_t(L), -1);
    for (const SlotPlan& p : plans) {
        const int64_t pr = p.rows == 1 ? 0 : row;
        std::vector<int32_t> before = slots;
        for (int64_t m = 0; m < p.moves; ++m)
            slots[size_t(p.move_to[size_t(pr * p.moves + m)])] = before[size_t(p.move_from[size_t(pr * p.moves + m)])];
        for (int64_t t = 0; t < p.n; ++t) slots[size_t(p.targets[size_t(pr * p.n + t)])] = int32_t(p.input_pos + t);
        out.push_back(slots);
    }
    return out;
}

bool holds(const std::vector<int32_t>& slots, int64_t token) {
    return std::find(slots.begin(), slots.end(), int32_t(token)) != slots.end();
}

class EvictionMapRun : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("run.kvlab");
        run_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 64)}).front();
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static int64_t run_;
};
test::ViewsScratchDir* EvictionMapRun::dir_ = nullptr;
std::string EvictionMapRun::path_;
int64_t EvictionMapRun::run_ = 0;

// A live run's map spans its whole sample on y from the first step (issue 37: it rescaled on
// every refresh as positions arrived); once the run has ended it fits the positions written.
// The recorded run is made "running" with a longer configured sample in a copy of its session.
TEST_F(EvictionMapRun, LiveMapKeepsItsAxisAtTheSampleLength) {
    const std::string copy = dir_->file("live.kvlab");
    std::filesystem::copy_file(path_, copy, std::filesystem::copy_options::overwrite_existing);
    auto set_status = [&](const char* status, int64_t seq_length) {
        sqlite3* db = nullptr;
        ASSERT_EQ(sqlite3_open(copy.c_str(), &db), SQLITE_OK);
        const std::string sql = "UPDATE runs SET status = '" + std::string(status) + "', config = json_set(config, '$.data.seq_length', " +
                                std::to_string(seq_length) + ") WHERE id = " + std::to_string(run_);
        ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
        sqlite3_close(db);
    };
    set_status("running", 4096);
    test::ImGuiHarness h;
    test::RecordingTextureHost host;
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    {
        storage::SessionReader reader(copy);
        ASSERT_TRUE(refresh_eviction_map(s, reader));
    }
    EXPECT_EQ(s.live_sample_tokens, 4096);
    h.window_frame([&] { DrawEvictionMapView(s, &host); });
    const int64_t written = s.data.sequences.back().layers.front().tokens;
    ASSERT_LT(written, 4096);
    EXPECT_EQ(s.tokens_range.hi, 4096.0) << "the live axis spans the sample, not the " << written << " positions written";
    set_status("done", 4096);
    {
        storage::SessionReader reader(copy);
        refresh_eviction_map(s, reader);
    }
    EXPECT_EQ(s.live_sample_tokens, 0);
    h.window_frame([&] { DrawEvictionMapView(s, &host); });
    EXPECT_EQ(s.tokens_range.hi, double(written)) << "an ended run fits what it wrote";
}

TEST_F(EvictionMapRun, PresenceImageMatchesHandReplayOfTheLog) {
    storage::SessionReader reader(path_);
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    ASSERT_TRUE(refresh_eviction_map(s, reader));
    ASSERT_EQ(s.data.sequences.size(), 2u);  // two samples, each cached from scratch
    const auto summary = nlohmann::json::parse(reader.run(run_).summary);
    const int chunks = summary.at("chunks_per_sample").get<int>();
    for (int seq = 0; seq < 2; ++seq)
        for (int layer = 0; layer < 2; ++layer) {
            const std::vector<SlotPlan> plans = test::layer_plans(reader, run_, layer, seq);
            ASSERT_EQ(int(plans.size()), chunks);
            const int64_t tokens = plans.back().input_pos + plans.back().n;
            int64_t rows = 1;
            for (const auto& p : plans) rows = std::max(rows, p.rows);
            ASSERT_EQ(rows, 2) << "h2o keeps one slot table per KV head";
            for (int row = 0; row < rows; ++row) {
                EvictionImageSpec spec;
                spec.sequence = seq, spec.layer = layer, spec.row = row;
                const EvictionImage img = build_eviction_image(s.data, spec);
                ASSERT_EQ(img.width, chunks) << "texture width == chunk steps of the run";
                ASSERT_EQ(img.height, tokens);
                ASSERT_EQ(img.tokens_per_texel, 1);
                ASSERT_EQ(img.steps_per_texel, 1);
                ASSERT_EQ(img.rgba.size(), size_t(img.width) * img.height * 4);
                const auto states = hand_replay(plans, row, 64);
                for (int x = 0; x < img.width; ++x)
                    for (int64_t y = 0; y < tokens; ++y) {
                        const size_t i = size_t(y) * img.width + size_t(x);
                        const bool cached = holds(states[size_t(x)], y);
                        ASSERT_EQ(img.presence[i], cached ? 1.f : 0.f) << "seq " << seq << " layer " << layer << " row " << row
                                                                      << " step " << x << " token " << y;
                        const Colour px = pack_rgba(img.rgba[i * 4], img.rgba[i * 4 + 1], img.rgba[i * 4 + 2], img.rgba[i * 4 + 3]);
                        ASSERT_EQ(px == kNoDataColour, !cached);
                    }
                // The engine's own replay agrees with the hand replay (cross-check of the test).
                int64_t r_out = 0;
                const auto eng = replay_positions(plans, plans.size(), 64, &r_out);
                EXPECT_TRUE(std::equal(states.back().begin(), states.back().end(), eng.begin() + row * 64));
            }
        }
}

TEST_F(EvictionMapRun, BinnedTexelsHoldTheFractionOfCachedTokenSteps) {
    storage::SessionReader reader(path_);
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    refresh_eviction_map(s, reader);
    const std::vector<SlotPlan> plans = test::layer_plans(reader, run_, 1, 0);
    const auto states = hand_replay(plans, 1, 64);
    const int tokens = int(plans.back().input_pos + plans.back().n);  // 255: the last bin is short
    EvictionImageSpec spec;
    spec.sequence = 0, spec.layer = 1, spec.row = 1;
    spec.max_height = 50;  // 256 tokens -> 8 tokens per texel (smallest power of two with <= 50 rows)
    spec.max_width = 4;    // 13 steps -> 4 steps per texel
    const EvictionImage img = build_eviction_image(s.data, spec);
    ASSERT_EQ(img.tokens_per_texel, 8);
    ASSERT_EQ(img.steps_per_texel, 4);
    ASSERT_EQ(img.height, (tokens + 7) / 8);
    ASSERT_EQ(img.width, 4);
    for (int y = 0; y < img.height; ++y)
        for (int x = 0; x < img.width; ++x) {
            int held = 0, pairs = 0;
            for (int st = x * 4; st < std::min(13, x * 4 + 4); ++st)
                for (int t = y * 8; t < std::min(tokens, y * 8 + 8); ++t) held += holds(states[size_t(st)], t), ++pairs;
            EXPECT_NEAR(img.presence[size_t(y) * img.width + x], double(held) / pairs, 1e-6) << x << "," << y;
        }
    // Age: mean over held (token, step) pairs of step - inserted step.
    spec.colour = EvictionColour::AGE;
    const EvictionImage age = build_eviction_image(s.data, spec);
    for (int y = 0; y < age.height; ++y)
        for (int x = 0; x < age.width; ++x) {
            double sum = 0;
            int held = 0;
            for (int st = x * 4; st < std::min(13, x * 4 + 4); ++st)
                for (int t = y * 8; t < std::min(tokens, y * 8 + 8); ++t)
                    if (holds(states[size_t(st)], t)) {
                        int ins = 0;
                        while (!(t >= plans[size_t(ins)].input_pos && t < plans[size_t(ins)].input_pos + plans[size_t(ins)].n)) ++ins;
                        sum += st - ins, ++held;
                    }
            const float v = age.value[size_t(y) * age.width + x];
            if (held == 0) EXPECT_TRUE(std::isnan(v));
            else EXPECT_NEAR(v, sum / held, 1e-4);
        }
}

TEST_F(EvictionMapRun, HitTestAndHoverDetailsMatchTheReplay) {
    storage::SessionReader reader(path_);
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    s.colour = EvictionColour::SCORE;
    s.layer = 0;
    refresh_eviction_map(s, reader);  // score mode loads layer 0's snapshots
    const int seq = 1, layer = 0, row = 1;
    const std::vector<SlotPlan> plans = test::layer_plans(reader, run_, layer, seq);
    const auto states = hand_replay(plans, row, 64);
    const int steps = int(plans.size());
    // A 10 px per step x 2 px per token frame at (100, 50).
    const ImVec2 p0(100, 50), p1(100 + 10.f * steps, 50 + 2.f * 256);
    const AxisRange xs{0, double(steps)}, ys{0, 256};
    EXPECT_FALSE(eviction_hit_test(xs, ys, p0, p1, ImVec2(99, 60), steps, 256).valid);
    EXPECT_FALSE(eviction_hit_test(xs, ys, p0, p1, ImVec2(p1.x, 60), steps, 256).valid);
    // Scores of this layer and sequence, by step, straight from the reader.
    std::vector<storage::ScoreRow> score_rows = reader.score_snapshots(run_, layer, 0, true);
    std::sort(score_rows.begin(), score_rows.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    std::vector<const storage::ScoreRow*> by_step;
    int sq = -1;
    for (const auto& r : score_rows) {
        if (r.chunk == 0) ++sq;
        if (sq == seq) by_step.push_back(&r);
    }
    ASSERT_EQ(int(by_step.size()), steps);
    int checked_cached = 0;
    for (int step : {0, 5, steps - 1}) {
        // Tokens in the first, middle and last slot after the step, plus some that are not cached.
        const auto& held = states[size_t(step)];
        std::vector<int64_t> probe = {held[0], held[32], held[63], 1, 100, 254};
        for (int64_t token : probe) {
            if (token < 0) continue;
            const ImVec2 pt(p0.x + 10.f * step + 5, p0.y + 2.f * token + 1);
            const EvictionHit h = eviction_hit_test(xs, ys, p0, p1, pt, steps, 256);
            ASSERT_TRUE(h.valid);
            ASSERT_EQ(h.step, step);
            ASSERT_EQ(h.token, token);
            const TokenAtStep info = eviction_token_info(s.data, seq, layer, row, h.token, h.step);
            const auto& slots = states[size_t(step)];
            const auto it = std::find(slots.begin(), slots.end(), int32_t(token));
            ASSERT_EQ(info.cached, it != slots.end());
            int inserted = -1;
            for (int k = 0; k < steps; ++k)
                if (token >= plans[size_t(k)].input_pos && token < plans[size_t(k)].input_pos + plans[size_t(k)].n) inserted = k;
            EXPECT_EQ(info.inserted_step, inserted);
            int evicted = -1;
            for (int k = std::max(0, inserted); k < steps && evicted < 0 && inserted >= 0; ++k)
                if (!holds(states[size_t(k)], token)) evicted = k;
            EXPECT_EQ(info.evicted_step, evicted);
            if (!info.cached) continue;
            ++checked_cached;
            EXPECT_EQ(info.slot, int(it - slots.begin()));
            EXPECT_EQ(info.age, step - inserted);
            const storage::ScoreRow& sr = *by_step[size_t(step)];
            ASSERT_TRUE(sr.has_values);
            EXPECT_EQ(info.score, sr.values[size_t(row) * sr.T + size_t(info.slot)]) << "step " << step << " token " << token;
        }
    }
    EXPECT_GE(checked_cached, 9);
}

TEST_F(EvictionMapRun, IncrementalRefreshEqualsFullReload) {
    // Feed the rows in three slices (as a live run would commit them) and compare with one read.
    storage::SessionReader reader(path_);
    std::vector<storage::CacheStepRow> all = reader.cache_steps(run_, -1);
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    EvictionData inc, full;
    for (size_t i = 0; i < all.size(); ++i) full.ingest(all[i]);
    for (size_t cut : {all.size() / 3, 2 * all.size() / 3, all.size()}) {
        for (size_t i = 0; i < cut; ++i)
            if (all[i].id > inc.last_step_id) inc.ingest(all[i]);
    }
    ASSERT_EQ(inc.sequences.size(), full.sequences.size());
    for (size_t q = 0; q < full.sequences.size(); ++q)
        for (size_t l = 0; l < full.sequences[q].layers.size(); ++l) {
            const EvictionLayer &a = inc.sequences[q].layers[l], &b = full.sequences[q].layers[l];
            ASSERT_EQ(a.steps(), b.steps());
            ASSERT_EQ(a.tracks.size(), b.tracks.size());
            for (size_t r = 0; r < a.tracks.size(); ++r) {
                EXPECT_EQ(a.tracks[r].evicted_at, b.tracks[r].evicted_at);
                EXPECT_EQ(a.tracks[r].slot_pos, b.tracks[r].slot_pos);
            }
        }
    // And through the reader, with the view's own refresh (state refreshed twice == fresh).
    EvictionMapViewState s1, s2;
    s1.refresh_budget_ms = test::kWholeRefresh;
    s2.refresh_budget_ms = test::kWholeRefresh;
    s1.run = s2.run = run_;
    refresh_eviction_map(s1, reader);
    EXPECT_FALSE(refresh_eviction_map(s1, reader)) << "nothing new: refresh reads nothing";
    refresh_eviction_map(s2, reader);
    EvictionImageSpec spec;
    spec.sequence = 1, spec.layer = 1, spec.row = 0;
    EXPECT_EQ(build_eviction_image(s1.data, spec).rgba, build_eviction_image(s2.data, spec).rgba);
}

// Grace-ring moves: a token copied to another slot before its old slot is reused stays cached.
TEST(EvictionMap, GraceRingMovesKeepTheMovedToken) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("moves.kvlab"));
    std::vector<SlotPlan> plans;
    {
        SlotPlan p;  // prefill 6 tokens into slots 0..5 of 8
        p.n = 6;
        for (int i = 0; i < 6; ++i) p.targets.push_back(i);
        p.length_after = 6;
        plans.push_back(p);
    }
    {
        SlotPlan p;  // 2 tokens into 6, 7
        p.input_pos = 6, p.n = 2, p.targets = {6, 7}, p.length_after = 8;
        plans.push_back(p);
    }
    {
        SlotPlan p;  // full: move slot 7 (token 7) to slot 1 (evicting token 1), write token 8 into 7
        p.input_pos = 8, p.n = 1, p.moves = 1, p.move_from = {7}, p.move_to = {1}, p.targets = {7}, p.length_after = 8;
        plans.push_back(p);
    }
    {
        SlotPlan p;  // two rows differ: row 0 evicts slot 0 (token 0), row 1 slot 2 (token 2)
        p.input_pos = 9, p.n = 1, p.rows = 2, p.targets = {0, 2}, p.length_after = 8;
        plans.push_back(p);
    }
    run.produce([&] {
        for (size_t k = 0; k < plans.size(); ++k)
            trace::cache_step(0, int(k), plans[k].input_pos, int(plans[k].n), 8, encode_plan(plans[k]));
    });
    run.finish();
    storage::SessionReader reader(run.path());
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run.run();
    refresh_eviction_map(s, reader);
    const EvictionLayer& ly = s.data.sequences.at(0).layers.at(0);
    ASSERT_EQ(ly.rows, 2);
    const auto& r0 = ly.tracks[0].evicted_at;
    const auto& r1 = ly.tracks[1].evicted_at;
    EXPECT_EQ(r0[1], 2) << "token 1 was overwritten by the move at step 2";
    EXPECT_EQ(r0[7], kStillCached) << "token 7 moved, not evicted";
    EXPECT_EQ(r0[0], 3);
    EXPECT_EQ(r1[0], kStillCached);
    EXPECT_EQ(r1[2], 3);
    for (int row = 0; row < 2; ++row) {
        const auto states = hand_replay(plans, row, 8);
        EvictionImageSpec spec;
        spec.row = row;
        const EvictionImage img = build_eviction_image(s.data, spec);
        for (int x = 0; x < img.width; ++x)
            for (int y = 0; y < img.height; ++y)
                EXPECT_EQ(img.presence[size_t(y) * img.width + x] > 0, holds(states[size_t(x)], y)) << row << " " << x << " " << y;
        const TokenAtStep t7 = eviction_token_info(s.data, 0, 0, row, 7, 2);
        EXPECT_TRUE(t7.cached);
        EXPECT_EQ(t7.slot, 1) << "after the move token 7 sits in slot 1";
    }
}

TEST(EvictionMap, DamagedBlobMarksTheLayerAndKeepsTheRest) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("bad.kvlab"));
    SlotPlan p;
    p.n = 4, p.targets = {0, 1, 2, 3}, p.length_after = 4;
    SlotPlan later = p;
    later.input_pos = 8;
    run.produce([&] {
        trace::cache_step(0, 0, 0, 4, 4, encode_plan(p));
        trace::cache_step(1, 0, 0, 4, 4, encode_plan(p));
        trace::cache_step(1, 1, 4, 4, 4, std::vector<uint8_t>{1, 2, 3});  // not a replay log
        trace::cache_step(1, 2, 8, 4, 4, encode_plan(later));
    });
    run.finish();
    storage::SessionReader reader(run.path());
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run.run();
    refresh_eviction_map(s, reader);
    ASSERT_EQ(s.data.sequences.size(), 1u);
    EXPECT_TRUE(s.data.sequences[0].layers[0].error.empty());
    EXPECT_NE(s.data.sequences[0].layers[1].error.find("layer 1 step 1"), std::string::npos) << s.data.sequences[0].layers[1].error;
    EXPECT_EQ(s.data.sequences[0].layers[1].steps(), 1);
    ImGuiHarness h;
    RecordingTextureHost host;
    s.layer = 1;
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawEvictionMapView(s, &host); });
    release_eviction_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
}

TEST(EvictionMap, TexelBudgetBinsTokensFirst) {
    // 40 steps of 128 tokens into 8 slots: 5120 positions.
    EvictionData d;
    for (int k = 0; k < 40; ++k) {
        SlotPlan p;
        p.input_pos = k * 128, p.n = 128;
        for (int t = 0; t < 128; ++t) p.targets.push_back(t % 8);  // only the last 8 of each chunk survive
        storage::CacheStepRow row;
        row.id = k + 1, row.layer = 0, row.chunk = k, row.cache_length = 8;
        row.replay_log = encode_plan(p);
        ASSERT_TRUE(d.ingest(row));
    }
    EvictionImageSpec spec;
    spec.max_width = 16, spec.max_height = 1000, spec.max_texels = 64 * 10;
    const EvictionImage img = build_eviction_image(d, spec);
    EXPECT_EQ(img.steps_per_texel, 4);   // 40 -> 10 columns
    EXPECT_EQ(img.width, 10);
    EXPECT_EQ(img.tokens_per_texel, 128);  // 8 (5120 -> 640 rows) doubled until 10 x rows <= 640
    EXPECT_EQ(img.height, 40);
    // Conservation: the texels' held pairs add up to 8 cached tokens per step.
    double held = 0;
    for (int y = 0; y < img.height; ++y)
        for (int x = 0; x < img.width; ++x)
            held += double(img.presence[size_t(y) * img.width + x]) * 128 * std::min(4, 40 - 4 * x);
    EXPECT_NEAR(held, 40.0 * 8, 1e-3);
}

TEST_F(EvictionMapRun, DrawsTexturesForOneLayerAndForAllLayers) {
    storage::SessionReader reader(path_);
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run_;
    refresh_eviction_map(s, reader);
    ImGuiHarness h;
    RecordingTextureHost host;
    int vtx = 0;
    // Three frames: a new window is hidden on its first, and hover needs one shown frame.
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawEvictionMapView(s, &host); }, ImVec2(700, 500));
    EXPECT_GT(vtx, 0);
    ASSERT_EQ(host.live.size(), 1u);
    const auto& tex = host.live.begin()->second;
    EXPECT_EQ(tex.width, 13);
    EXPECT_EQ(tex.height, s.data.sequences.back().layers[0].tokens);
    EXPECT_EQ(tex.pixels, s.main.image.rgba);
    EXPECT_EQ(tex.uploads, 1) << "unchanged data and selection: no re-upload";
    EXPECT_TRUE(s.hovered) << "the mouse is over the map: a tooltip was computed";
    // Wheel over the map zooms (and stops following the data).
    h.window_frame([&] { DrawEvictionMapView(s, &host); }, ImVec2(700, 500), false, 2.0f);
    EXPECT_FALSE(s.follow);
    EXPECT_LT(s.steps_range.span(), 13.0);
    s.all_layers = true;
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawEvictionMapView(s, &host); });
    EXPECT_EQ(s.layer_textures.size(), 2u);
    EXPECT_EQ(host.live.size(), 3u);
    release_eviction_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
}

}  // namespace
}  // namespace kv::views

namespace kv::views {
namespace {

// A sample whose cache never filled records no scores; the next sample's scores must join that
// next sample (by time), not the first.
TEST(EvictionMap, ScoresJoinTheSequenceTheyWereRecordedIn) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("scores.kvlab"));
    SlotPlan short_prefill, full_prefill;
    short_prefill.n = 4, short_prefill.targets = {0, 1, 2, 3}, short_prefill.length_after = 4;
    full_prefill.n = 8, full_prefill.targets = {0, 1, 2, 3, 4, 5, 6, 7}, full_prefill.length_after = 8;
    std::vector<float> values(8);
    for (int i = 0; i < 8; ++i) values[size_t(i)] = 10.f + float(i);
    run.produce([&] {
        trace::cache_step(0, 0, 0, 4, 8, encode_plan(short_prefill));  // sample 0: no scores
        trace::cache_step(0, 0, 0, 8, 8, encode_plan(full_prefill));   // sample 1
        trace::scores(0, 0, values.data(), 1, 1, 8);
    });
    run.finish();
    storage::SessionReader reader(run.path());
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run.run();
    s.colour = EvictionColour::SCORE;
    refresh_eviction_map(s, reader);
    ASSERT_EQ(s.data.sequences.size(), 2u);
    const auto& sc = s.data.scores.at(0).sequences;
    ASSERT_EQ(sc.size(), 2u);
    EXPECT_TRUE(sc[0].empty());
    ASSERT_EQ(sc[1].size(), 1u);
    const TokenAtStep t = eviction_token_info(s.data, 1, 0, 0, 5, 0);
    EXPECT_TRUE(t.cached);
    EXPECT_EQ(t.slot, 5);
    EXPECT_EQ(t.score, 15.f);
    EvictionImageSpec spec;
    spec.sequence = 1, spec.colour = EvictionColour::SCORE;
    const EvictionImage img = build_eviction_image(s.data, spec);
    ASSERT_EQ(img.height, 8);
    EXPECT_EQ(img.value[5], 15.f);
    EXPECT_EQ(img.value_min, 10.f);
    EXPECT_EQ(img.value_max, 17.f);
    // Colours rise with the score along the column.
    for (int y = 1; y < 8; ++y) {
        auto lum = [&](int row) {
            const uint8_t* p = img.rgba.data() + size_t(row) * 4;
            return colour_luminance(pack_rgba(p[0], p[1], p[2]));
        };
        EXPECT_GT(lum(y), lum(y - 1)) << y;
    }
}

// Quest's mode: the score stream of a read policy holds each slot's share of queries that read
// its page; the image shows those shares on the fixed scale [0, 1] (not the chunk's range).
TEST(EvictionMap, QuestReadsShowTheReadShareOnAFixedScale) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("quest.kvlab"));
    SlotPlan prefill, step;
    prefill.n = 8, prefill.targets = {0, 1, 2, 3, 4, 5, 6, 7}, prefill.length_after = 8;
    step.input_pos = 8, step.n = 1, step.targets = {8}, step.length_after = 9;
    // pages of 3 slots read by 1, 2 and 1 of 3 query heads (slots 9.. are empty)
    const std::vector<float> shares = {1.f / 3, 1.f / 3, 1.f / 3, 2.f / 3, 2.f / 3, 2.f / 3, 1.f / 3, 1.f / 3, 1.f / 3, 0, 0, 0};
    run.produce([&] {
        trace::cache_step(0, 0, 0, 8, 12, encode_plan(prefill));
        trace::cache_step(0, 1, 8, 1, 12, encode_plan(step));
        trace::scores(0, 1, shares.data(), 1, 1, 12);
    });
    run.finish();
    storage::SessionReader reader(run.path());
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run.run();
    s.colour = EvictionColour::READS;
    refresh_eviction_map(s, reader);
    EvictionImageSpec spec;
    spec.colour = EvictionColour::READS;
    const EvictionImage img = build_eviction_image(s.data, spec);
    ASSERT_EQ(img.height, 9);
    ASSERT_EQ(img.width, 2);
    EXPECT_EQ(img.value_min, 0.f);  // fixed: the shares themselves span only [1/3, 2/3]
    EXPECT_EQ(img.value_max, 1.f);
    for (int y = 0; y < 9; ++y) EXPECT_FLOAT_EQ(img.value[size_t(y) * 2 + 1], shares[size_t(y)]) << "position " << y;
    const EvictionColourKey k = eviction_colour_key(img);
    EXPECT_STREQ(k.title, "share of queries reading the page");
    EXPECT_STREQ(eviction_colour_name(EvictionColour::READS), "quest reads");
}

// The all-layers small multiples show Quest's reads too: every layer's score stream is read and
// each thumbnail holds its own layer's shares (layers select different pages).
TEST(EvictionMap, QuestReadsInEveryLayersThumbnail) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("quest_layers.kvlab"));
    SlotPlan prefill, step;
    prefill.n = 4, prefill.targets = {0, 1, 2, 3}, prefill.length_after = 4;
    step.input_pos = 4, step.n = 1, step.targets = {4}, step.length_after = 5;
    // pages of 2 slots: layer 0 reads page 0 with every head, layer 1 page 1 with half of them
    const std::vector<float> shares0 = {1, 1, 0, 0, 1, 0}, shares1 = {0, 0, 0.5f, 0.5f, 1, 0};
    run.produce([&] {
        for (int layer = 0; layer < 2; ++layer) {
            trace::cache_step(layer, 0, 0, 4, 6, encode_plan(prefill));
            trace::cache_step(layer, 1, 4, 1, 6, encode_plan(step));
            trace::scores(layer, 1, (layer ? shares1 : shares0).data(), 1, 1, 6);
        }
    });
    run.finish();
    storage::SessionReader reader(run.path());
    EvictionMapViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run.run();
    s.colour = EvictionColour::READS;
    s.all_layers = true;
    while (refresh_eviction_map(s, reader)) {
    }
    update_eviction_textures(s, nullptr, 100);
    ASSERT_EQ(s.layer_textures.size(), 2u);
    for (int layer = 0; layer < 2; ++layer) {
        const EvictionImage& img = s.layer_textures[size_t(layer)].image;
        ASSERT_EQ(img.spec.colour, EvictionColour::READS) << "layer " << layer;
        ASSERT_EQ(img.height, 5) << "layer " << layer;
        ASSERT_EQ(img.width, 2) << "layer " << layer;
        const std::vector<float>& want = layer ? shares1 : shares0;
        for (int y = 0; y < 5; ++y) EXPECT_FLOAT_EQ(img.value[size_t(y) * 2 + 1], want[size_t(y)]) << "layer " << layer << " position " << y;
    }
    // Scores still show one layer at a time: their thumbnails fall back to presence.
    s.colour = EvictionColour::SCORE;
    update_eviction_textures(s, nullptr, 100);
    EXPECT_EQ(s.layer_textures[0].image.spec.colour, EvictionColour::PRESENCE);
}

}  // namespace
}  // namespace kv::views
