// Metrics view: one curve point per metric row, x sorted (steps or time), nearest-point lookup,
// incremental refresh equal to a full reload, headless draw.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "views/metrics_view.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

TEST(Metrics, OneCurvePointPerMetricRow) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("run.kvlab");
    const int64_t run = test::record_tiny_runs(path, {test::tiny_eval_config("lastrec-default", 64, 256, 3)}).front();
    storage::SessionReader reader(path);
    MetricsViewState s;
    s.run = run;
    ASSERT_TRUE(refresh_metrics(s, reader));
    const auto names = reader.metric_names(run);
    ASSERT_EQ(s.series.size(), names.size());
    for (const auto& name : names) {
        const auto rows = reader.metrics(run, name);
        const MetricSeries& m = s.series.at(s.index.at(name));
        for (bool over_time : {false, true}) {
            const MetricCurve c = metric_curve(m, over_time, s.t0_ns);
            ASSERT_EQ(c.x.size(), rows.size()) << name;
            EXPECT_TRUE(std::is_sorted(c.x.begin(), c.x.end()));
            // The same multiset of (x, value) pairs as the rows.
            std::multimap<double, double> want, got;
            for (const auto& r : rows) want.emplace(over_time ? double(r.t_ns - s.t0_ns) * 1e-9 : double(r.step), r.value);
            for (size_t i = 0; i < c.x.size(); ++i) got.emplace(c.x[i], c.y[i]);
            EXPECT_EQ(got, want) << name;
        }
    }
    EXPECT_EQ(s.series.at(s.index.at("sample_loss")).values.size(), 3u) << "one per sample";
    test::ImGuiHarness h;
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = h.window_frame([&] { DrawMetricsView(s); }, ImVec2(300, 120));
    EXPECT_GT(vtx, 0);
}

TEST(Metrics, TheDenseRunOfTheSameDataIsOverlaid) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("runs.kvlab");
    // h2o and dense on the same samples; a dense run on other samples must not be chosen.
    const auto runs = test::record_tiny_runs(path, {test::tiny_eval_config("h2o-default", 64, 256, 3),
                                                    test::tiny_eval_config("dense-default", 0, 256, 3),
                                                    test::tiny_eval_config("dense-default", 0, 512, 3)});
    storage::SessionReader reader(path);
    MetricsViewState s;
    s.run = runs[0];
    ASSERT_TRUE(refresh_metrics(s, reader));
    EXPECT_EQ(s.reference_run, runs[1]);
    const auto want = reader.metrics(runs[1], "sample_loss");
    ASSERT_EQ(want.size(), 3u);
    ASSERT_TRUE(s.reference.count("sample_loss"));
    const MetricSeries& got = s.reference.at("sample_loss");
    ASSERT_EQ(got.values.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got.values[i], want[i].value);
        EXPECT_EQ(got.steps[i], want[i].step);
    }
    // The curves differ (a 64-slot cache loses something), and a dense run has no reference.
    EXPECT_NE(s.series.at(s.index.at("sample_loss")).values, got.values);
    EXPECT_EQ(find_dense_reference(reader.runs(), runs[1]), 0);
    EXPECT_EQ(find_dense_reference(reader.runs(), 9999), 0);
    test::ImGuiHarness h;
    for (int f = 0; f < 2; ++f) EXPECT_GT(h.window_frame([&] { DrawMetricsView(s); }), 0);
}

TEST(Metrics, NearestPoint) {
    MetricSeries m{"loss", {1, 2, 3, 4}, {0, 10, 20, 30}, {0, 0, 0, 0}, {4.0, 3.0, 2.5, 2.0}};
    const MetricCurve c = metric_curve(m, false, 0);
    EXPECT_EQ(nearest_point(c, -5), 0);
    EXPECT_EQ(nearest_point(c, 14), 1);
    EXPECT_EQ(nearest_point(c, 16), 2);
    EXPECT_EQ(nearest_point(c, 99), 3);
    EXPECT_DOUBLE_EQ(c.y_lo, 2.0);
    EXPECT_DOUBLE_EQ(c.y_hi, 4.0);
    MetricCurve empty = metric_curve(MetricSeries{}, false, 0);
    EXPECT_EQ(nearest_point(empty, 1), -1);
}

TEST(Metrics, IncrementalRefreshEqualsFullReload) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("metrics.kvlab"));
    storage::SessionReader reader(run.path());
    MetricsViewState live;
    live.run = run.run();
    for (int phase = 0; phase < 3; ++phase) {
        run.produce([&] {
            for (int i = 0; i < 10; ++i) {
                trace::metric("loss", phase * 10 + i, 1.0 / (1 + phase * 10 + i));
                if (i % 3 == 0) trace::metric("accuracy", phase * 10 + i, 0.1 * phase);
            }
        });
        run.flush();
        EXPECT_TRUE(refresh_metrics(live, reader));
    }
    EXPECT_FALSE(refresh_metrics(live, reader));
    MetricsViewState fresh;
    fresh.run = run.run();
    refresh_metrics(fresh, reader);
    ASSERT_EQ(live.series.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(live.series[i].name, fresh.series[i].name);
        EXPECT_EQ(live.series[i].ids, fresh.series[i].ids);
        EXPECT_EQ(live.series[i].values, fresh.series[i].values);
    }
    EXPECT_EQ(live.series[live.index.at("loss")].values.size(), 30u);
    EXPECT_EQ(live.series[live.index.at("accuracy")].values.size(), 12u);
}

// A fidelity run of a 30-layer model records 2 x 30 per-layer series and the next-token KL:
// by default the plots show the KL and the two means over layers, the 60 per-layer curves wait
// behind their family's node, and the plots stay reachable however many are checked.
TEST(Metrics, PerLayerSeriesStartHiddenBehindTheirMeanAndThePlotsScroll) {
    MetricsViewState s;
    const int kLayers = 30, kSteps = 8;
    auto add = [&](const std::string& name, auto value) {
        MetricSeries m;
        m.name = name;
        for (int k = 0; k < kSteps; ++k)
            m.ids.push_back(int64_t(s.series.size()) * 100 + k), m.steps.push_back(k), m.t_ns.push_back(1000 * k), m.values.push_back(value(k));
        s.index[name] = s.series.size();
        s.series.push_back(std::move(m));
    };
    for (int l = 0; l < kLayers; ++l)
        for (const char* q : {"attn_rel_error", "kept_mass"})
            add(std::string("fidelity.") + q + ".layer" + std::to_string(l), [&](int k) { return k + 0.01 * l; });
    add("fidelity.next_token_kl", [](int k) { return 0.5 * k; });
    s.layer_means = layer_mean_series(s.series);
    ASSERT_EQ(s.layer_means.size(), 2u);
    for (const MetricSeries& m : s.layer_means) {
        ASSERT_EQ(m.values.size(), size_t(kSteps)) << m.name;
        // mean of k + 0.01 l over l = 0..29: k + 0.145
        for (int k = 0; k < kSteps; ++k) EXPECT_NEAR(m.values[size_t(k)], k + 0.145, 1e-12) << m.name;
    }
    int layer = -1;
    std::string family;
    EXPECT_TRUE(per_layer_metric("fidelity.kept_mass.layer12", &family, &layer));
    EXPECT_EQ(family, "fidelity.kept_mass");
    EXPECT_EQ(layer, 12);
    EXPECT_FALSE(per_layer_metric("fidelity.next_token_kl"));
    EXPECT_FALSE(per_layer_metric("fidelity.layerwise"));

    test::ImGuiHarness h(1280, 800);
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawMetricsView(s); });
    const std::set<std::string> shown(s.shown_plots.begin(), s.shown_plots.end());
    EXPECT_EQ(shown, (std::set<std::string>{"fidelity.next_token_kl", "fidelity.attn_rel_error.mean_over_layers",
                                            "fidelity.kept_mass.mean_over_layers"}));
    EXPECT_EQ(s.shown_plots.size(), 3u);
    EXPECT_EQ(s.shown_plots_scroll_max, 0.f) << "three plots share the height";
    // Every per-layer curve of one family checked: 33 plots, still starting at the top, the
    // region scrolling to the rest.
    for (int l = 0; l < kLayers; ++l) s.shown_layers.push_back("fidelity.kept_mass.layer" + std::to_string(l));
    for (int f = 0; f < 2; ++f) h.window_frame([&] { DrawMetricsView(s); });
    EXPECT_EQ(s.shown_plots.size(), 33u);
    EXPECT_LT(s.shown_plots_top, 0.2f * 800) << "the list of curves does not push the plots down";
    EXPECT_GT(s.shown_plots_scroll_max, 0.f);
}

}  // namespace
}  // namespace kv::views
