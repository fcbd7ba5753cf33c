// Fidelity and sweep views: the fidelity grid holds every fidelity.* metric row of a recorded
// --fidelity run at its (layer, chunk) and its layer profile is the row mean; the sweep panels
// hold every done run's summary value at its cache length (dense as the reference); headless
// draws; a click on a sweep point asks the host for that run.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <nlohmann/json.hpp>

#include "storage/config_fields.h"
#include "storage/session.h"
#include "storage/session_reader.h"
#include "views/canvas_impl.h"
#include "views/fidelity_view.h"
#include "views/sweep_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

TEST(FidelityView, ParsesTheMetricNames) {
    FidelityQuantity q;
    int layer = -2;
    ASSERT_TRUE(parse_fidelity_metric("fidelity.attn_rel_error.layer12", &q, &layer));
    EXPECT_EQ(q, FidelityQuantity::ATTN_ERROR);
    EXPECT_EQ(layer, 12);
    ASSERT_TRUE(parse_fidelity_metric("fidelity.kept_mass.layer0", &q, &layer));
    EXPECT_EQ(q, FidelityQuantity::KEPT_MASS);
    EXPECT_EQ(layer, 0);
    ASSERT_TRUE(parse_fidelity_metric("fidelity.next_token_kl", &q, &layer));
    EXPECT_EQ(q, FidelityQuantity::NEXT_TOKEN_KL);
    EXPECT_EQ(layer, -1);
    for (const char* bad : {"sample_loss", "fidelity.kept_mass", "fidelity.kept_mass.layer", "fidelity.kept_mass.layerx",
                            "fidelity.next_token_kl.layer3", "fidelity.other.layer1"})
        EXPECT_FALSE(parse_fidelity_metric(bad, &q, &layer)) << bad;
}

TEST(FidelityView, GridHoldsEveryRowOfARecordedFidelityRun) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("fid.kvlab");
    RunConfig cfg = test::tiny_eval_config("lastrec-default", 64, 256, 2, 32);
    cfg.fidelity = true;
    RunConfig dense = test::tiny_eval_config("dense-default", 0, 256, 2, 32);
    dense.fidelity = true;
    const auto runs = test::record_tiny_runs(path, {cfg, dense});
    storage::SessionReader reader(path);
    FidelityViewState s;
    fidelity_select(s, runs);
    ASSERT_TRUE(refresh_fidelity(s, reader));
    EXPECT_FALSE(refresh_fidelity(s, reader)) << "nothing new on a second refresh";
    ASSERT_EQ(s.grids.size(), 2u);
    const FidelityGrid& g = s.grids[0];
    // Every fidelity row, and only those, sits in the grid at its (layer, step).
    size_t rows = 0, kl_rows = 0;
    std::map<int, std::pair<double, int>> mass_by_layer;
    for (const auto& m : reader.metrics(runs[0])) {
        FidelityQuantity q;
        int layer = 0;
        if (!parse_fidelity_metric(m.name, &q, &layer)) continue;
        ++rows;
        kl_rows += q == FidelityQuantity::NEXT_TOKEN_KL;
        EXPECT_EQ(g.at(q, std::max(layer, 0), m.step), m.value) << m.name << " step " << m.step;
        if (q == FidelityQuantity::KEPT_MASS) mass_by_layer[layer].first += m.value, mass_by_layer[layer].second += 1;
    }
    ASSERT_GT(rows, 0u);
    ASSERT_GT(kl_rows, 0u) << "a fidelity run records the next-token KL per chunk";
    EXPECT_EQ(g.layers, int(mass_by_layer.size()));
    EXPECT_EQ(g.steps, int64_t(kl_rows));
    const std::vector<double> prof = g.layer_profile(FidelityQuantity::KEPT_MASS);
    for (const auto& [l, sum] : mass_by_layer) EXPECT_NEAR(prof[size_t(l)], sum.first / sum.second, 1e-12) << "layer " << l;
    // The dense run is exact: KL 0, mass 1 in every cell.
    const FidelityGrid& d = s.grids[1];
    for (int64_t t = 0; t < d.steps; ++t) {
        EXPECT_EQ(d.at(FidelityQuantity::NEXT_TOKEN_KL, 0, t), 0.0);
        for (int l = 0; l < d.layers; ++l) EXPECT_EQ(d.at(FidelityQuantity::KEPT_MASS, l, t), 1.0);
    }
    // The evicting run loses something somewhere.
    double min_mass = 1;
    for (int l = 0; l < g.layers; ++l)
        for (int64_t t = 0; t < g.steps; ++t) min_mass = std::min(min_mass, g.at(FidelityQuantity::KEPT_MASS, l, t));
    EXPECT_LT(min_mass, 1.0);
    test::ImGuiHarness h(900, 600);
    // With the mouse over the maps (the hover path draws its outline and tooltip).
    for (int f = 0; f < 3; ++f) EXPECT_GT(h.window_frame([&] { DrawFidelityView(s); }, ImVec2(200, 120)), 0);
}

// A run launched with fidelity has no rows until its first sample ends: the view says it is
// recording, not "launch with --fidelity true" (issue 37); once the run ends with none, it says
// so; a run without fidelity gets the how-to.
TEST(FidelityView, ALiveFidelityRunIsRecordingNotMissing) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("live.kvlab");
    int64_t live = 0, plain = 0;
    {
        auto session = storage::Session::create(path);
        RunConfig cfg = test::tiny_eval_config("h2o-default", 64, 256, 1, 32);
        cfg.fidelity = true;
        live = session->create_run("live", run_config_to_json(cfg));
        session->start_run(live);
        cfg.fidelity = false;
        plain = session->create_run("plain", run_config_to_json(cfg));
        session->start_run(plain);
    }
    auto message = [&](int64_t run) {
        storage::SessionReader reader(path);
        FidelityViewState s;
        fidelity_select(s, {run});
        refresh_fidelity(s, reader);
        return fidelity_empty_message(s);
    };
    EXPECT_NE(message(live).find("recording fidelity"), std::string::npos) << message(live);
    EXPECT_NE(message(plain).find("launch the run with --fidelity true"), std::string::npos) << message(plain);
    {
        storage::Session::open(path)->finish_run(live, storage::RunStatus::CANCELLED, "cancelled");
    }
    EXPECT_NE(message(live).find("ended before its first sample"), std::string::npos) << message(live);
}

TEST(FidelityView, GridGrowsAndKeepsValues) {
    FidelityGrid g;
    g.add(FidelityQuantity::ATTN_ERROR, 0, 0, 0.5);
    g.add(FidelityQuantity::NEXT_TOKEN_KL, -1, 3, 0.25);
    g.add(FidelityQuantity::ATTN_ERROR, 2, 1, 0.75);
    EXPECT_EQ(g.layers, 3);
    EXPECT_EQ(g.steps, 4);
    EXPECT_EQ(g.at(FidelityQuantity::ATTN_ERROR, 0, 0), 0.5);
    EXPECT_EQ(g.at(FidelityQuantity::ATTN_ERROR, 2, 1), 0.75);
    EXPECT_EQ(g.at(FidelityQuantity::NEXT_TOKEN_KL, 0, 3), 0.25);
    EXPECT_TRUE(std::isnan(g.at(FidelityQuantity::ATTN_ERROR, 1, 1)));
    EXPECT_TRUE(std::isnan(g.at(FidelityQuantity::ATTN_ERROR, 0, 9)));
    const auto p = g.layer_profile(FidelityQuantity::ATTN_ERROR);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0], 0.5);
    EXPECT_TRUE(std::isnan(p[1]));
    EXPECT_EQ(p[2], 0.75);
}

storage::RunInfo fake_run(int64_t id, const std::string& task, const std::string& cache, int64_t L, const std::string& summary,
                          storage::RunStatus st = storage::RunStatus::DONE) {
    storage::RunInfo r;
    r.id = id;
    r.status = st;
    r.config = nlohmann::json{{"mode", "eval_long"}, {"data", {{"name", task}}}, {"kv_cache", {{"name", cache}, {"cache_length", L}}}}.dump();
    r.summary = summary;
    return r;
}

TEST(SweepView, PanelsHoldEveryDoneRunAtItsCacheLength) {
    const std::vector<storage::RunInfo> runs = {
        fake_run(1, "repeat", "dense-default", 0, R"({"copy_token_accuracy": 1.0, "mean_loss": 0.5})"),
        fake_run(2, "repeat", "h2o-default", 256, R"({"copy_token_accuracy": 0.25, "mean_loss": 2.0})"),
        fake_run(3, "repeat", "h2o-default", 512, R"({"copy_token_accuracy": 0.5, "mean_loss": 1.5})"),
        fake_run(4, "repeat", "lastrec-default", 256, R"({"copy_token_accuracy": 0.125})"),
        fake_run(5, "text", "h2o-default", 256, R"({"perplexity": 20.0, "mean_loss": 3.0})"),
        fake_run(6, "text", "dense-default", 0, R"({"perplexity": 15.0})"),
        fake_run(7, "repeat", "tova-default", 256, R"({"copy_token_accuracy": 0.9})", storage::RunStatus::RUNNING),
        fake_run(8, "repeat", "h2o-default", 512, R"({"copy_token_accuracy": 0.625})"),  // a cell run twice: mean, s.e., n
    };
    const auto panels = sweep_panels(runs, "auto");
    ASSERT_EQ(panels.size(), 2u);
    const SweepPanel& rp = panels[0];
    EXPECT_EQ(rp.task, "repeat");
    EXPECT_EQ(rp.metric, "copy_token_accuracy");
    ASSERT_EQ(rp.references.size(), 1u);
    EXPECT_EQ(rp.references[0].y, 1.0);
    EXPECT_EQ(rp.references[0].run, 1);
    ASSERT_EQ(rp.lines.size(), 2u) << "a running run is not drawn yet";
    EXPECT_EQ(rp.lines[0].label, "h2o-default");
    ASSERT_EQ(rp.lines[0].points.size(), 2u);
    EXPECT_EQ(rp.lines[0].points[0].x, 256);
    EXPECT_EQ(rp.lines[0].points[0].y, 0.25);
    EXPECT_EQ(rp.lines[0].points[1].x, 512);
    // runs 3 and 8: mean (0.5 + 0.625) / 2; sample s.d. |0.625 - 0.5| / sqrt(2), over sqrt(2)
    EXPECT_DOUBLE_EQ(rp.lines[0].points[1].y, 0.5625);
    EXPECT_DOUBLE_EQ(rp.lines[0].points[1].se, 0.0625);
    EXPECT_EQ(rp.lines[0].points[1].n, 2);
    EXPECT_EQ(rp.lines[0].points[1].runs, (std::vector<int64_t>{3, 8}));
    EXPECT_EQ(rp.lines[0].points[1].run, 8) << "a click selects the newest";
    EXPECT_EQ(rp.lines[0].points[0].n, 1);
    EXPECT_EQ(rp.lines[0].points[0].se, 0.0);
    EXPECT_EQ(rp.repeated, 1);
    EXPECT_TRUE(rp.experiment_fields.empty()) << "one experiment: cache and length only";
    EXPECT_EQ(rp.lines[1].label, "lastrec-default");
    EXPECT_EQ(panels[1].task, "text");
    EXPECT_EQ(panels[1].metric, "perplexity");
    EXPECT_EQ(panels[1].references[0].y, 15.0);
    // An explicit metric: runs without it are left out.
    const auto loss = sweep_panels(runs, "mean_loss");
    ASSERT_EQ(loss.size(), 2u);
    ASSERT_EQ(loss[0].lines.size(), 1u);
    EXPECT_EQ(loss[0].lines[0].points.size(), 2u);
    EXPECT_EQ(loss[0].lines[0].points[1].y, 1.5) << "run 8 records no mean_loss: run 3's stands";
    EXPECT_EQ(loss[0].lines[0].points[1].n, 1);
    const auto names = sweep_metrics(runs);
    for (const char* m : {"copy_token_accuracy", "mean_loss", "perplexity"})
        EXPECT_NE(std::find(names.begin(), names.end(), m), names.end()) << m;
}

storage::RunInfo run_with(int64_t id, const std::string& cache, int64_t L, nlohmann::json extra, double y) {
    storage::RunInfo r;
    r.id = id;
    r.status = storage::RunStatus::DONE;
    nlohmann::json c = {{"mode", "eval_long"},
                        {"name", "run " + std::to_string(id)},  // names never split lines
                        {"telemetry", {{"score_interval", id}}},  // nor does what is recorded
                        {"data", {{"name", "repeat"}, {"seq_length", 1024}, {"num_samples", 4}}},
                        {"kv_cache", {{"name", cache}, {"cache_length", L}, {"chunk_size", 64}}},
                        {"fidelity", false}};
    if (extra.is_object()) c.merge_patch(extra);  // (a null patch would replace the whole object)
    r.config = c.dump();
    r.summary = nlohmann::json{{"copy_token_accuracy", y}}.dump();
    return r;
}

TEST(SweepView, ExperimentsThatDifferAreNeverOneLine) {
    // Two sequence lengths and a fidelity run of one task: three experiments, each with its own
    // h2o line and its own dense reference; nothing averaged across them.
    const nlohmann::json l2048 = {{"data", {{"seq_length", 2048}}}}, fid = {{"fidelity", true}};
    const std::vector<storage::RunInfo> runs = {
        run_with(1, "dense-default", 0, {}, 0.9),           run_with(2, "h2o-default", 256, {}, 0.3),
        run_with(3, "h2o-default", 512, {}, 0.5),           run_with(4, "dense-default", 0, l2048, 0.8),
        run_with(5, "h2o-default", 256, l2048, 0.1),        run_with(6, "h2o-default", 512, l2048, 0.2),
        run_with(7, "h2o-default", 256, fid, 0.3),          run_with(8, "h2o-default", 256, {}, 0.4),
    };
    const auto panels = sweep_panels(runs, "auto");
    ASSERT_EQ(panels.size(), 1u);
    const SweepPanel& p = panels[0];
    EXPECT_EQ(p.experiment_fields, (std::vector<std::string>{"data.seq_length", "fidelity"}));
    ASSERT_EQ(p.lines.size(), 3u);
    std::map<std::string, const SweepLine*> by;
    for (const SweepLine& l : p.lines) {
        EXPECT_EQ(l.cache, "h2o-default");
        by[l.experiment] = &l;
    }
    const SweepLine* a = by["data.seq_length=1024, fidelity=false"];
    const SweepLine* b = by["data.seq_length=2048, fidelity=false"];
    const SweepLine* c = by["data.seq_length=1024, fidelity=true"];
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(a->label, "h2o-default | data.seq_length=1024, fidelity=false");
    ASSERT_EQ(a->points.size(), 2u);
    EXPECT_DOUBLE_EQ(a->points[0].y, 0.35) << "runs 2 and 8: the same configuration, averaged";
    EXPECT_EQ(a->points[0].n, 2);
    EXPECT_EQ(a->points[1].y, 0.5);
    ASSERT_EQ(b->points.size(), 2u);
    EXPECT_EQ(b->points[0].y, 0.1) << "2048 tokens never mix with 1024";
    EXPECT_EQ(b->points[1].y, 0.2);
    ASSERT_EQ(c->points.size(), 1u);
    EXPECT_EQ(c->points[0].y, 0.3);
    EXPECT_EQ(c->points[0].run, 7);
    ASSERT_EQ(p.references.size(), 2u);
    EXPECT_EQ(p.references[0].label, "dense | data.seq_length=1024, fidelity=false");
    EXPECT_EQ(p.references[0].y, 0.9);
    EXPECT_EQ(p.references[1].label, "dense | data.seq_length=2048, fidelity=false");
    EXPECT_EQ(p.references[1].y, 0.8);
    EXPECT_EQ(p.repeated, 1);
    EXPECT_EQ(a->points[0].samples, "4");
}

TEST(SweepView, RecordedRunsDrawAndAClickRequestsThatRun) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("sweep.kvlab");
    const auto runs = test::record_tiny_runs(path, {test::tiny_eval_config("dense-default", 0), test::tiny_eval_config("lastrec-default", 64),
                                                    test::tiny_eval_config("lastrec-default", 128)});
    storage::SessionReader reader(path);
    SweepViewState s;
    ASSERT_TRUE(refresh_sweep(s, reader));
    EXPECT_FALSE(refresh_sweep(s, reader)) << "no run finished since";
    ASSERT_EQ(s.panels.size(), 1u);
    ASSERT_EQ(s.panels[0].lines.size(), 1u);
    const SweepLine& l = s.panels[0].lines[0];
    ASSERT_EQ(l.points.size(), 2u);
    for (const SweepPoint& p : l.points) {
        const nlohmann::json sum = nlohmann::json::parse(reader.run(p.run).summary);
        EXPECT_EQ(p.y, sum[s.panels[0].metric].get<double>());
        EXPECT_EQ(p.x, std::stod(storage::run_config_value(reader.run(p.run).config, "kv_cache.cache_length")));
    }
    EXPECT_EQ(s.panels[0].references.at(0).run, runs[0]);
    // Through the canvas: the sweep view draws with one run selected, and a click on a point
    // becomes the host's request for that run.
    views::Canvas canvas(nullptr);
    canvas.open_session(path);
    canvas.set_view(view_named("sweep"));
    canvas.refresh();
    test::ImGuiHarness h(1000, 700);
    for (int f = 0; f < 2; ++f) EXPECT_GT(h.frame([&] { canvas.draw(1000, 700); }, ImVec2(500, 350)), 0);
    EXPECT_EQ(canvas.take_requested_run(), 0);
    canvas.impl().state<SweepViewState>().requested_run = runs[2];  // what a click sets (DrawSweepView)
    EXPECT_EQ(canvas.take_requested_run(), runs[2]);
    EXPECT_EQ(canvas.take_requested_run(), 0);
}

}  // namespace
}  // namespace kv::views
