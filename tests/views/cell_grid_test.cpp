// Cell grid: the schedule recorded by a real run (layers x chunks per sample, cells from the
// forward's CELL spans with their peak memory from the raw events), gradient-pipeline cells
// from the cells table, hit testing, incremental refresh and a headless draw.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "views/cell_grid.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

TEST(CellGrid, ForwardRunGivesOneGridPerSampleWithCellsAndPeaks) {
    test::ViewsScratchDir dir;
    const std::string path = dir.file("run.kvlab");
    const int64_t run = test::record_tiny_runs(path, {test::tiny_eval_config("lastrec-default", 64)}).front();
    storage::SessionReader reader(path);
    CellGridViewState s;
    s.refresh_budget_ms = test::kWholeRefresh;
    s.run = run;
    ASSERT_TRUE(refresh_cell_grid(s, reader));
    while (refresh_cell_grid(s, reader)) {  // budgeted: cell peaks may take further refreshes
    }
    EXPECT_TRUE(s.pending_peaks.empty());
    const int chunks = nlohmann::json::parse(reader.run(run).summary).at("chunks_per_sample").get<int>();
    ASSERT_EQ(s.sequences.size(), 2u);
    const auto events = reader.memory_events(run);
    for (const GridSequence& g : s.sequences) {
        EXPECT_EQ(g.layers, 2);
        EXPECT_EQ(g.chunks, chunks);
        EXPECT_EQ(g.done, 2 * chunks);
        ASSERT_FALSE(g.cells.empty());
        for (int l = 0; l < g.layers; ++l)
            for (int c = 0; c < g.chunks; ++c) {
                const GridChunk* k = g.find(l, c);
                ASSERT_TRUE(k && k->done);
                EXPECT_GE(k->end_ns, k->start_ns);
                // Every chunk lies in the cell it was computed in.
                const GridCell& cell = *std::find_if(g.cells.begin(), g.cells.end(), [&](const GridCell& x) { return x.col == k->cell_col; });
                EXPECT_TRUE(l >= cell.layer_begin && l < cell.layer_end && c >= cell.chunk_begin && c < cell.chunk_end);
            }
        int64_t covered = 0;
        for (const GridCell& cell : g.cells) {
            EXPECT_TRUE(cell.finished);
            covered += int64_t(cell.layer_end - cell.layer_begin) * (cell.chunk_end - cell.chunk_begin);
            // Peak inside the cell, by hand: the level held when it started, then every event in it.
            int64_t level = 0, peak = 0;
            for (const auto& e : events) {
                if (e.t_ns < cell.start_ns) level = e.device_total;
            }
            peak = level;
            for (const auto& e : events)
                if (e.t_ns >= cell.start_ns && e.t_ns <= cell.end_ns) peak = std::max(peak, e.device_total);
            EXPECT_EQ(cell.peak_bytes, peak) << "cell " << cell.col;
        }
        EXPECT_EQ(covered, int64_t(g.layers) * g.chunks) << "cells tile the grid";
    }
    // Hit testing: a 10 px per chunk, 20 px per layer grid.
    const GridSequence& g = s.sequences[1];
    const ImVec2 p0(0, 0), p1(10.f * g.chunks, 40);
    const GridHit h = cell_grid_hit_test(g, p0, p1, ImVec2(10.f * 5 + 3, 25));
    ASSERT_TRUE(h.valid);
    EXPECT_EQ(h.layer, 1);
    EXPECT_EQ(h.chunk, 5);
    ASSERT_GE(h.cell, 0);
    EXPECT_EQ(g.cells[size_t(h.cell)].col, g.find(1, 5)->cell_col);
    EXPECT_FALSE(cell_grid_hit_test(g, p0, p1, ImVec2(-1, 5)).valid);
    // Image: one texel per (layer, chunk).
    const GridImage img = build_cell_grid_image(g);
    EXPECT_EQ(img.width, chunks);
    EXPECT_EQ(img.height, 2);

    test::ImGuiHarness harness;
    test::RecordingTextureHost host;
    int vtx = 0;
    for (int f = 0; f < 3; ++f) vtx = harness.window_frame([&] { DrawCellGridView(s, &host); }, ImVec2(300, 100));
    EXPECT_GT(vtx, 0);
    EXPECT_EQ(host.live.size(), 1u);
    release_cell_grid_textures(s, &host);
    EXPECT_TRUE(host.live.empty());
}

TEST(CellGrid, GradientCellsFromTheCellsTableArriveIncrementally) {
    test::ViewsScratchDir dir;
    test::SyntheticRun run(dir.file("cells.kvlab"));
    storage::SessionReader reader(run.path());
    CellGridViewState live;
    live.refresh_budget_ms = test::kWholeRefresh;
    live.run = run.run();
    auto cell = [&](int row, int col, int64_t peak) {
        run.produce([&] {
            for (int l = 2 * row; l < 2 * row + 2; ++l)
                for (int c = 4 * col; c < 4 * col + 4; ++c)
                    trace::span_complete(trace::SpanCategory::CHUNK, trace::Name("chunk"), uint64_t(run.t0() + 100 * c),
                                         uint64_t(run.t0() + 100 * c + 50), {.layer = l, .chunk = c});
            trace::CellInfo ci;
            ci.row = row, ci.col = col;
            ci.layer_begin = 2 * row, ci.layer_end = 2 * row + 2;
            ci.chunk_begin = 4 * col, ci.chunk_end = 4 * col + 4;
            ci.start_ns = uint64_t(run.t0() + 1000 * (row * 3 + col));
            ci.end_ns = ci.start_ns + 900;
            ci.peak_bytes = peak;
            trace::cell(ci);
        });
        run.flush();
        refresh_cell_grid(live, reader);
    };
    cell(0, 0, 1000);
    ASSERT_EQ(live.sequences.size(), 1u);
    EXPECT_EQ(live.sequences[0].cells.size(), 1u);
    cell(0, 1, 3000);
    cell(1, 0, 2000);
    run.finish();
    refresh_cell_grid(live, reader);
    CellGridViewState fresh;
    fresh.refresh_budget_ms = test::kWholeRefresh;
    fresh.run = run.run();
    refresh_cell_grid(fresh, reader);
    ASSERT_EQ(live.sequences.size(), fresh.sequences.size());
    const GridSequence &a = live.sequences[0], &b = fresh.sequences[0];
    EXPECT_EQ(a.layers, 4);
    EXPECT_EQ(a.chunks, 8);
    EXPECT_EQ(a.done, b.done);
    ASSERT_EQ(a.cells.size(), b.cells.size());
    int table_cells = 0;
    for (size_t i = 0; i < a.cells.size(); ++i) {
        EXPECT_EQ(a.cells[i].col, b.cells[i].col);
        EXPECT_EQ(a.cells[i].peak_bytes, b.cells[i].peak_bytes);
        if (a.cells[i].from_table) {
            ++table_cells;
            const int64_t want = a.cells[i].row == 1 ? 2000 : a.cells[i].col == 1 ? 3000 : 1000;
            EXPECT_EQ(a.cells[i].peak_bytes, want);
        }
    }
    EXPECT_EQ(table_cells, 3);
    // Hit testing prefers the gradient cell where it overlaps the chunk spans' own.
    const GridHit h = cell_grid_hit_test(a, ImVec2(0, 0), ImVec2(80, 40), ImVec2(65, 5));
    ASSERT_GE(h.cell, 0);
    EXPECT_TRUE(a.cells[size_t(h.cell)].from_table);
    EXPECT_EQ(a.cells[size_t(h.cell)].col, 1);
}

}  // namespace
}  // namespace kv::views
