// A session written by the CLI in another process, opened afterwards (nothing played live in
// this process): through the host protocol only (draw, then serve the frame's draw requests; no
// direct Canvas::refresh), every view draws the run's data, and every place that prints a peak
// reports the same number (issue 16).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "storage/comparison.h"
#include "storage/exports.h"
#include "storage/session_reader.h"
#include "views/canvas.h"
#include "views/canvas_impl.h"
#include "views/eviction_map.h"
#include "views/scores_view.h"
#include "views/memory_timeline.h"
#include "views/cell_grid.h"
#include "views/metrics_view.h"
#include "views/compare_view.h"
#include "engine/core/error.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

// The runs the CLI records: 256 tokens in chunks of 16 = 16 chunk steps per layer and sequence.
constexpr int kSeq = 256, kChunk = 16;

std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

class RecordedSession : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("cli.kvlab");
        for (const char* policy : {"h2o-default", "lastrec-default"}) {
            const std::string out = dir_->file(std::string(policy) + ".out");
            const std::string cmd = std::string(KVLAB_BINARY_DIR "/bin/kvlab eval_long tiny --data passkey --data.seq_length ") +
                                    std::to_string(kSeq) + " --data.num_samples 1 --kv_cache.name " + policy +
                                    " --kv_cache.cache_length 64 --kv_cache.chunk_size " + std::to_string(kChunk) +
                                    " --threads 1 --session " + path_ + " > " + out + " 2>&1";
            ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << slurp(out);
            outputs_.push_back(slurp(out));
        }
        storage::SessionReader reader(path_);
        for (const auto& r : reader.runs()) runs_.push_back(r.id);
        ASSERT_EQ(runs_.size(), 2u);
    }
    static void TearDownTestSuite() { delete dir_; }

    // What a host does every frame: draw, then serve what the frame asked for, until quiet.
    static void host_frames(test::ImGuiHarness& h, Canvas& canvas) {
        for (int f = 0; f < 50; ++f) {
            h.frame([&] { canvas.draw(1280, 800); });
            if (!canvas.has_draw_requests()) break;
            canvas.serve_draw_requests();
        }
        h.frame([&] { canvas.draw(1280, 800); });
    }

    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
    static std::vector<std::string> outputs_;
};
test::ViewsScratchDir* RecordedSession::dir_ = nullptr;
std::string RecordedSession::path_;
std::vector<int64_t> RecordedSession::runs_;
std::vector<std::string> RecordedSession::outputs_;

TEST_F(RecordedSession, EveryViewDrawsAFinishedRunOpenedFromDisk) {
    storage::SessionReader reader(path_);
    const int64_t run = runs_.front();
    const int64_t peak = storage::run_peak_bytes(reader.run(run).summary);
    ASSERT_GT(peak, 0);
    test::ImGuiHarness h(1280, 800);
    test::RecordingTextureHost host;
    {
        Canvas canvas(&host);
        canvas.open_session(path_);
        canvas.select_runs({run});
        CanvasImpl& c = canvas.impl();

        // The run's chunk steps and token positions, from its stored rows (layer 0, pass 0; one
        // sample, so one sequence).
        int steps = 0;
        int64_t positions = 0;
        for (const auto& r : reader.cache_steps(run, 0))
            if (r.pass == 0) ++steps, positions = std::max<int64_t>(positions, r.input_pos + r.num_tokens);
        ASSERT_GT(steps, 1);
        ASSERT_GT(positions, kSeq / 2);

        canvas.set_view(view_named("eviction map"));
        host_frames(h, canvas);
        ASSERT_TRUE(c.state<EvictionMapViewState>().main.valid) << "the eviction map drew no image of a finished run";
        EXPECT_EQ(c.state<EvictionMapViewState>().main.image.width, steps) << "one texel column per chunk step";
        EXPECT_EQ(c.state<EvictionMapViewState>().main.image.height, positions) << "one texel row per token position";
        ASSERT_EQ(host.live.count(c.state<EvictionMapViewState>().main.id), 1u);
        EXPECT_EQ(host.live[c.state<EvictionMapViewState>().main.id].width, steps);
        EXPECT_EQ(host.live[c.state<EvictionMapViewState>().main.id].height, positions);

        canvas.set_view(view_named("scores"));
        host_frames(h, canvas);
        EXPECT_FALSE(c.state<ScoresViewState>().layers.empty()) << "h2o records scores";
        EXPECT_NE(c.state<ScoresViewState>().texture_id, 0u) << "the scores view uploaded nothing";

        canvas.set_view(view_named("memory timeline"));
        host_frames(h, canvas);
        EXPECT_EQ(c.state<MemoryTimelineViewState>().peak_bytes(-2), peak) << "timeline peak vs the run summary's peak";

        canvas.set_view(view_named("cell grid"));
        host_frames(h, canvas);
        EXPECT_FALSE(c.state<CellGridViewState>().sequences.empty());
        EXPECT_NE(c.state<CellGridViewState>().texture_id, 0u);

        canvas.set_view(view_named("metrics"));
        host_frames(h, canvas);
        EXPECT_FALSE(c.state<MetricsViewState>().series.empty());

        canvas.select_runs(runs_);
        ASSERT_EQ(canvas.view(), view_named("compare"));
        host_frames(h, canvas);
        ASSERT_TRUE(c.state<CompareViewState>().have_comparison) << c.state<CompareViewState>().comparison_error;
        ASSERT_EQ(c.state<CompareViewState>().maps.size(), runs_.size());
        for (const auto& m : c.state<CompareViewState>().maps) {
            EXPECT_FALSE(m.data.sequences.empty()) << "compare map of run " << m.run << " is empty";
        }
    }
    EXPECT_TRUE(host.live.empty());
}

// The per-token loss and token text of a run the CLI recorded: the metrics view's curve is the
// stored losses (checked against the session's rows read here), every selected run overlays,
// and the eviction map holds the sample's token text for its tooltips.
TEST_F(RecordedSession, PerTokenLossAndTokenTextOfACliRunDraw) {
    storage::SessionReader reader(path_);
    test::ImGuiHarness h(1280, 800);
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    canvas.open_session(path_);
    canvas.select_runs({runs_.front()});
    CanvasImpl& c = canvas.impl();
    canvas.set_view(view_named("metrics"));
    host_frames(h, canvas);
    const auto rows = reader.sample_tokens(runs_.front());
    ASSERT_EQ(rows.size(), 1u);  // one passkey sample
    const nlohmann::json summary = nlohmann::json::parse(reader.run(runs_.front()).summary);
    ASSERT_EQ(int64_t(rows[0].ids.size()), summary["tokens"].get<int64_t>());
    ASSERT_FALSE(c.state<MetricsViewState>().loss_runs.empty());
    const auto& shown = c.state<MetricsViewState>().loss_runs.front().tokens.samples;
    ASSERT_EQ(shown.size(), 1u);
    EXPECT_EQ(shown[0].ids, rows[0].ids);
    // passkey scores the answer at the last position only: the curve is that one value.
    const std::vector<double> curve = position_mean_loss(shown, -1);
    ASSERT_EQ(curve.size(), rows[0].ids.size());
    for (size_t t = 0; t + 1 < curve.size(); ++t) EXPECT_TRUE(std::isnan(curve[t])) << t;
    EXPECT_NEAR(curve.back(), reader.metrics(runs_.front(), "sample_loss").at(0).value, 1e-5);
    // Both runs: the metrics view overlays them instead of asking for one run.
    canvas.select_runs(runs_);
    canvas.set_view(view_named("metrics"));
    host_frames(h, canvas);
    EXPECT_EQ(c.empty_state(), "");
    ASSERT_EQ(c.state<MetricsViewState>().loss_runs.size(), 2u);
    EXPECT_EQ(c.state<MetricsViewState>().loss_runs[1].run, runs_[1]);
    EXPECT_EQ(c.state<MetricsViewState>().loss_runs[1].tokens.samples.size(), 1u);
    // The eviction map's tooltips: the stored pieces of the shown sample.
    canvas.select_runs({runs_.front()});
    canvas.set_view(view_named("eviction map"));
    host_frames(h, canvas);
    ASSERT_EQ(c.state<EvictionMapViewState>().tokens.samples.size(), 1u);
    EXPECT_EQ(c.state<EvictionMapViewState>().tokens.sample(0)->pieces, rows[0].pieces);
    EXPECT_EQ(token_label(c.state<EvictionMapViewState>().tokens.sample(0), 3), printable_piece(rows[0].pieces[3]) + " (id " + std::to_string(rows[0].ids[3]) + ")");
}

TEST_F(RecordedSession, EmptyStatesSayWhatIsSelected) {
    test::ImGuiHarness h(1280, 800);
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    canvas.open_session(path_);
    canvas.select_runs({});
    host_frames(h, canvas);
    EXPECT_EQ(canvas.impl().empty_state(), "select a run in the runs table");
    canvas.select_runs(runs_);
    canvas.set_view(view_named("eviction map"));
    host_frames(h, canvas);
    const std::string two = canvas.impl().empty_state();
    EXPECT_NE(two.find("2 runs selected"), std::string::npos) << two;
    EXPECT_EQ(two.find("recorded yet"), std::string::npos) << two;
    canvas.select_runs({runs_.front()});
    host_frames(h, canvas);
    EXPECT_EQ(canvas.impl().empty_state(), "") << "one finished run: its data, no empty state";
    canvas.open_session("");
    EXPECT_EQ(canvas.impl().empty_state(), "no session open");
}

TEST_F(RecordedSession, EveryPeakPrinterReportsTheSameNumber) {
    storage::SessionReader reader(path_);
    for (size_t i = 0; i < runs_.size(); ++i) {
        const int64_t run = runs_[i];
        // Independent reference: the largest allocator device total among the run's memory
        // events, from the CSV export's device_total column.
        std::ostringstream csv;
        storage::export_memory_csv(reader, run, csv);
        std::istringstream lines(csv.str());
        std::string line;
        std::getline(lines, line);
        size_t col = 0;
        {
            std::istringstream hdr(line);
            std::string name;
            for (size_t k = 0; std::getline(hdr, name, ','); ++k)
                if (name == "device_total") col = k;
        }
        ASSERT_GT(col, 0u);
        int64_t csv_max = -1;
        while (std::getline(lines, line)) {
            std::istringstream fields(line);
            std::string f;
            for (size_t k = 0; k <= col; ++k) std::getline(fields, f, ',');
            csv_max = std::max<int64_t>(csv_max, std::stoll(f));
        }
        ASSERT_GT(csv_max, 0);

        EXPECT_EQ(storage::run_peak_bytes(reader.run(run).summary), csv_max) << "run summary";

        // Chrome trace: the memory counter's series add up to the device total.
        std::ostringstream trace;
        storage::export_chrome_trace(reader, run, false, true, false, trace);
        const nlohmann::json tj = nlohmann::json::parse(trace.str());
        int64_t trace_max = -1;
        for (const auto& e : tj["traceEvents"])
            if (e.value("ph", "") == "C" && e.value("name", "").rfind("memory", 0) == 0) {
                int64_t sum = 0;
                for (const auto& [k, v] : e["args"].items()) sum += v.get<int64_t>();
                trace_max = std::max(trace_max, sum);
            }
        EXPECT_EQ(trace_max, csv_max) << "Chrome trace counter";

        // kvlab compare (and the GUI compare view, which shows the same Comparison).
        const storage::Comparison cmp = storage::compare_runs(reader, runs_, runs_.front());
        EXPECT_EQ(int64_t(cmp.runs[i].peak_bytes), csv_max) << "compare";

        // The memory timeline's legend.
        MemoryTimelineViewState tl;
        tl.refresh_budget_ms = test::kWholeRefresh;
        tl.run = run;
        while (refresh_memory_timeline(tl, reader)) {
        }
        EXPECT_EQ(tl.peak_bytes(-2), csv_max) << "memory timeline";

        // Printed text: eval_long's summary line and kvlab runs, as the CLI formats bytes.
        const std::string shown = kv::format_bytes((long long)csv_max);
        EXPECT_NE(outputs_[i].find("peak memory: " + shown + " (whole run"), std::string::npos)
            << "eval_long printed:\n" << outputs_[i] << "\nexpected peak " << shown;
        const std::string runs_out = dir_->file("runs.out");
        ASSERT_EQ(std::system((std::string(KVLAB_BINARY_DIR "/bin/kvlab runs ") + path_ + " > " + runs_out + " 2>&1").c_str()), 0);
        const std::string table = slurp(runs_out);
        EXPECT_NE(table.find(shown), std::string::npos) << "kvlab runs printed:\n" << table << "\nexpected peak " << shown;
    }
}

}  // namespace
}  // namespace kv::views
