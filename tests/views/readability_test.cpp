// Plots a person can read: every view of recorded tiny runs drawn headless, then the frame's
// text is checked glyph by glyph from the draw data (independently of how views lay it out):
// no glyph is cut by a clip rectangle or the canvas edge (a clipped label), and no two glyphs
// of the frame overlap (labels drawn over each other: "0 B" on "0 s", a map's caption running
// into its neighbour's). Plus the pure pieces: round tick values in the unit an axis prints,
// the compare grid and the dense reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "storage/config_fields.h"
#include "views/canvas_impl.h"
#include "views/eviction_map.h"
#include "views/compare_view.h"
#include "views/plot_util.h"
#include "views_test_util.h"

namespace kv::views {
namespace {

// ---- glyphs from draw data ----------------------------------------------------------------
struct Glyph {
    float x0, y0, x1, y1;
    bool clipped;
};

// Every glyph quad of the frame: a quad (indices v, v+1, v+2, v, v+2, v+3, as ImDrawList::
// PrimRectUV emits) whose texture rectangle is one of the font's glyphs.
std::vector<Glyph> frame_glyphs(const ImDrawData* dd, float w, float h) {
    const ImFont* font = ImGui::GetIO().Fonts->Fonts[0];
    auto is_glyph_uv = [&](float u0, float v0, float u1, float v1) {
        for (const ImFontGlyph& g : font->Glyphs)
            if (g.Visible && std::fabs(g.U0 - u0) < 1e-6f && std::fabs(g.V0 - v0) < 1e-6f && std::fabs(g.U1 - u1) < 1e-6f &&
                std::fabs(g.V1 - v1) < 1e-6f)
                return true;
        return false;
    };
    std::vector<Glyph> out;
    for (int l = 0; l < dd->CmdListsCount; ++l) {
        const ImDrawList* list = dd->CmdLists[l];
        for (const ImDrawCmd& cmd : list->CmdBuffer) {
            if (cmd.UserCallback) continue;
            const ImDrawIdx* idx = list->IdxBuffer.Data + cmd.IdxOffset;
            for (unsigned i = 0; i + 5 < cmd.ElemCount;) {
                const unsigned v = idx[i];
                const bool quad = idx[i + 1] == v + 1 && idx[i + 2] == v + 2 && idx[i + 3] == v && idx[i + 4] == v + 2 &&
                                  idx[i + 5] == v + 3;
                if (!quad) {
                    i += 3;
                    continue;
                }
                const ImDrawVert* q = list->VtxBuffer.Data + cmd.VtxOffset + v;
                if (!is_glyph_uv(q[0].uv.x, q[0].uv.y, q[2].uv.x, q[2].uv.y)) {
                    i += 3;
                    continue;
                }
                Glyph g{q[0].pos.x, q[0].pos.y, q[2].pos.x, q[2].pos.y, false};
                const ImVec4 c = cmd.ClipRect;
                g.clipped = g.x0 < std::max(c.x, 0.f) - 0.5f || g.y0 < std::max(c.y, 0.f) - 0.5f || g.x1 > std::min(c.z, w) + 0.5f ||
                            g.y1 > std::min(c.w, h) + 0.5f;
                out.push_back(g);
                i += 6;
            }
        }
    }
    return out;
}

// Problems of one frame's text, described for the failure message ("" when none).
std::string text_problems(const std::vector<Glyph>& glyphs) {
    std::ostringstream os;
    int clipped = 0, overlaps = 0;
    for (const Glyph& g : glyphs)
        if (g.clipped && clipped++ < 5) os << "clipped glyph at (" << g.x0 << ", " << g.y0 << ")\n";
    for (size_t a = 0; a < glyphs.size(); ++a)
        for (size_t b = a + 1; b < glyphs.size(); ++b) {
            const Glyph &p = glyphs[a], &q = glyphs[b];
            const float ix = std::min(p.x1, q.x1) - std::max(p.x0, q.x0), iy = std::min(p.y1, q.y1) - std::max(p.y0, q.y0);
            if (ix > 1 && iy > 1 && overlaps++ < 5)
                os << "glyphs overlap at (" << p.x0 << ", " << p.y0 << ") and (" << q.x0 << ", " << q.y0 << ")\n";
        }
    if (clipped || overlaps) os << clipped << " clipped, " << overlaps << " overlapping glyph pairs";
    return os.str();
}

class Readability : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        dir_ = new test::ViewsScratchDir;
        path_ = dir_->file("runs.kvlab");
        runs_ = test::record_tiny_runs(path_, {test::tiny_eval_config("h2o-default", 128, 1024, 2, 32),
                                               test::tiny_eval_config("dense-default", 0, 1024, 2, 32),
                                               test::tiny_eval_config("lastrec-default", 128, 1024, 2, 32),
                                               test::tiny_eval_config("streaming-default", 128, 1024, 2, 32)});
    }
    static void TearDownTestSuite() {
        delete dir_;
        dir_ = nullptr;
    }
    // Draws `canvas` until its state settles, then returns the last frame's glyphs.
    static std::vector<Glyph> settle_and_draw(test::ImGuiHarness& h, Canvas& canvas) {
        for (int i = 0; i < 50 && (canvas.refresh() || canvas.has_draw_requests()); ++i) canvas.serve_draw_requests();
        for (int f = 0; f < 3; ++f) {
            h.frame([&] { canvas.draw(h.width(), h.height()); });
            canvas.serve_draw_requests();
        }
        return frame_glyphs(ImGui::GetDrawData(), h.width(), h.height());
    }
    static test::ViewsScratchDir* dir_;
    static std::string path_;
    static std::vector<int64_t> runs_;
};
test::ViewsScratchDir* Readability::dir_ = nullptr;
std::string Readability::path_;
std::vector<int64_t> Readability::runs_;

TEST_F(Readability, EverySingleRunViewHasNoClippedOrOverlappingText) {
    for (const ImVec2 size : {ImVec2(1280, 800), ImVec2(900, 600)}) {
        test::ImGuiHarness h(size.x, size.y);
        test::RecordingTextureHost host;
        Canvas canvas(&host);
        canvas.open_session(path_);
        canvas.select_runs({runs_[0]});
        for (ViewKind k : {view_named("eviction map"), view_named("scores"), view_named("memory timeline"), view_named("cell grid"), view_named("metrics")}) {
            canvas.set_view(k);
            const auto glyphs = settle_and_draw(h, canvas);
            EXPECT_GT(glyphs.size(), 60u) << view_name(k) << ": the frame should hold labels";
            EXPECT_EQ(text_problems(glyphs), "") << view_name(k) << " at " << size.x << "x" << size.y;
        }
        canvas.set_view(view_named("eviction map"));
        for (EvictionColour c : {EvictionColour::SCORE, EvictionColour::AGE}) {
            canvas.impl().state<EvictionMapViewState>().colour = c;
            canvas.impl().needs_refresh = true;
            EXPECT_EQ(text_problems(settle_and_draw(h, canvas)), "") << eviction_colour_name(c);
        }
        canvas.impl().state<EvictionMapViewState>().all_layers = true;
        EXPECT_EQ(text_problems(settle_and_draw(h, canvas)), "") << "all layers";
    }
}

TEST_F(Readability, CompareShowsEveryMapWithoutClippedOrOverlappingText) {
    for (const ImVec2 size : {ImVec2(1600, 1000), ImVec2(1020, 560)}) {
        test::ImGuiHarness h(size.x, size.y);
        test::RecordingTextureHost host;
        Canvas canvas(&host);
        canvas.open_session(path_);
        canvas.select_runs(runs_);
        ASSERT_EQ(canvas.view(), view_named("compare"));
        // Where the minimum sizes do not fit, the region below the toolbar scrolls: a label cut
        // by its bottom edge is scrolled to, not lost. Every other cut or overlap is a fault.
        const auto scrolled_off = [&](std::vector<Glyph> glyphs) {
            const CompareViewState& c = canvas.impl().state<CompareViewState>();
            if (c.shown.scroll_max_y > 0)
                std::erase_if(glyphs, [&](const Glyph& g) { return g.clipped && g.y0 < c.shown.body.w && g.y1 > c.shown.body.w - 0.5f; });
            return glyphs;
        };
        const auto glyphs = scrolled_off(settle_and_draw(h, canvas));
        EXPECT_EQ(text_problems(glyphs), "") << "compare at " << size.x << "x" << size.y;
        // Every map was drawn inside the canvas: its texture's full extent is on screen.
        const CompareViewState& c = canvas.impl().state<CompareViewState>();
        ASSERT_EQ(c.maps.size(), runs_.size());
        for (const auto& m : c.maps) {
            EXPECT_TRUE(m.main.valid);
            EXPECT_GT(m.main.image.width, 0);
        }
        // The difference map of two policies (h2o and lastrec: display order 1 and 2) in place
        // of the maps, with its legend and counts.
        canvas.impl().state<CompareViewState>().show_difference = true;
        canvas.impl().state<CompareViewState>().difference_a = 1;
        canvas.impl().state<CompareViewState>().difference_run = 2;
        canvas.impl().state<CompareViewState>().difference_chosen = true;
        EXPECT_EQ(text_problems(scrolled_off(settle_and_draw(h, canvas))), "") << "difference map at " << size.x << "x" << size.y;
        EXPECT_EQ(canvas.impl().state<CompareViewState>().difference.error, "");
        EXPECT_GT(canvas.impl().state<CompareViewState>().difference.counts.both, 0);
    }
}

// ---- pure pieces ------------------------------------------------------------------------------
// True when v is k * 10^e for k in {1, 2, 5} (the steps a reader counts in).
bool round_step(double v) {
    const double e = std::floor(std::log10(v) + 1e-9), m = v / std::pow(10.0, e);
    return std::fabs(m - 1) < 1e-6 || std::fabs(m - 2) < 1e-6 || std::fabs(m - 5) < 1e-6;
}

TEST(AxisTicks, BytesStepRoundlyInTheUnitTheyPrint) {
    const double MiB = 1024.0 * 1024, GiB = 1024 * MiB;
    struct Case {
        double hi;
        const char* suffix;
        double unit;
    };
    // 634.9 MiB and 1.00 GiB peaks (the run) with the 8% headroom the views add; 5 KiB.
    for (const Case& c : {Case{634.9 * MiB * 1.08, " MiB", MiB}, Case{1.0 * GiB * 1.08, " GiB", GiB}, Case{5 * 1024.0, " KiB", 1024.0}}) {
        const AxisTicks t = axis_ticks(AxisUnit::BYTES, 0, c.hi, 6);
        ASSERT_GE(t.values.size(), 3u) << c.hi;
        ASSERT_EQ(t.values.size(), t.labels.size());
        EXPECT_TRUE(round_step(t.step / c.unit)) << t.step / c.unit;
        for (size_t i = 0; i < t.values.size(); ++i) {
            // the label is the value in the unit, and the value is a whole number of steps
            EXPECT_NE(t.labels[i].find(c.suffix), std::string::npos) << t.labels[i];
            EXPECT_NEAR(std::strtod(t.labels[i].c_str(), nullptr), t.values[i] / c.unit, 1e-9) << t.labels[i];
            EXPECT_NEAR(std::remainder(t.values[i], t.step), 0.0, t.step * 1e-9);
            EXPECT_GE(t.values[i], 0.0);
            EXPECT_LE(t.values[i], c.hi);
        }
    }
    // 190.73 MiB (200 MB) must never be a tick of a 0..1 GiB axis.
    for (double v : axis_ticks(AxisUnit::BYTES, 0, 1.08 * GiB, 6).values) EXPECT_EQ(std::fmod(v, 0.1 * GiB) < 1 || std::fmod(v, 0.1 * GiB) > 0.1 * GiB - 1, true) << v;
}

TEST(AxisTicks, TimesAndCountsStepRoundly) {
    const AxisTicks t = axis_ticks(AxisUnit::NANOSECONDS, 0, 2.37e9, 6);  // 2.37 s
    ASSERT_GE(t.values.size(), 3u);
    EXPECT_TRUE(round_step(t.step / 1e9));
    for (size_t i = 0; i < t.labels.size(); ++i) {
        EXPECT_NE(t.labels[i].find(" s"), std::string::npos) << t.labels[i];
        EXPECT_NEAR(std::strtod(t.labels[i].c_str(), nullptr) * 1e9, t.values[i], 1);
    }
    const AxisTicks ms = axis_ticks(AxisUnit::SECONDS, 0, 0.0042, 4);  // 4.2 ms given in seconds
    for (const auto& l : ms.labels) EXPECT_NE(l.find(" ms"), std::string::npos) << l;
    const AxisTicks tok = axis_ticks(AxisUnit::NUMBER, 0, 100000, 5);
    EXPECT_TRUE(round_step(tok.step));
    for (size_t i = 0; i < tok.labels.size(); ++i)
        EXPECT_NEAR(std::strtod(tok.labels[i].c_str(), nullptr) * (tok.labels[i].back() == 'k' ? 1e3 : 1.0), tok.values[i], 1e-6)
            << tok.labels[i];
}

TEST(CompareGrid, NoMapBelowTheMinimumAndTheLargestThatFits) {
    for (int n = 1; n <= 8; ++n)
        for (const ImVec2 area : {ImVec2(1600, 500), ImVec2(1000, 300), ImVec2(600, 800), ImVec2(1510, 430), ImVec2(150, 150)}) {
            const CompareGrid g = compare_grid(n, area.x, area.y);
            ASSERT_GE(g.cols * g.rows, n);
            EXPECT_LT((g.cols - 1) * g.rows, n) << "a whole empty column";
            // Never a sliver: every map at least the minimum panel, both ways.
            EXPECT_GE(g.cell_w, kCompareMinPanel);
            EXPECT_GE(g.cell_h, kCompareMinPanel);
            // Columns never run past the width unless one column of the minimum already does.
            if (area.x >= kCompareMinPanel) {
                EXPECT_LE(g.width(), area.x + 0.01f) << n << " maps in " << area.x;
            }
            // Every layout of columns of at least the minimum width, checked independently.
            bool any_fits = false;
            float best = 0;
            int fewest_rows = n;
            for (int cols = 1; cols <= n; ++cols) {
                const float w = (area.x - kCompareGap * float(cols - 1)) / float(cols);
                if (w < kCompareMinPanel && cols > 1) break;
                const int rows = (n + cols - 1) / cols;
                const float h = (area.y - kCompareGap * float(rows - 1)) / float(rows);
                fewest_rows = std::min(fewest_rows, rows);
                if (h >= kCompareMinPanel) any_fits = true, best = std::max(best, std::min(std::max(w, kCompareMinPanel), h));
            }
            if (any_fits) {
                EXPECT_LE(g.height(), area.y + 0.01f) << n << " maps: a layout fits, so no scrolling";
                EXPECT_GE(std::min(g.cell_w, g.cell_h), best - 1e-3f) << n << " maps in " << area.x << "x" << area.y;
            } else {
                EXPECT_EQ(g.rows, fewest_rows) << n << " maps: scrolling, as little as can be";
            }
        }
    // The case: five maps in the width a 1600 px canvas leaves beside the colour bar sit
    // in one row, each well over the minimum.
    const CompareGrid five = compare_grid(5, 1510, 430);
    EXPECT_EQ(five.rows, 1);
    EXPECT_GE(five.cell_w, 280);
}

TEST_F(Readability, TheDenseRunIsTheCompareReference) {
    storage::SessionReader reader(path_);
    // runs_[1] is the dense one, selected second.
    ASSERT_EQ(storage::run_policy(reader.run(runs_[1]).config), "dense");
    test::RecordingTextureHost host;
    Canvas canvas(&host);
    canvas.open_session(path_);
    canvas.select_runs(runs_);
    EXPECT_EQ(canvas.impl().reference, runs_[1]);
    canvas.refresh();
    EXPECT_EQ(canvas.impl().state<CompareViewState>().comparison.reference, runs_[1]);
    EXPECT_EQ(canvas.impl().state<CompareViewState>().infos.front().id, runs_[1]);
    // Without a dense run, the first selected is the reference.
    canvas.select_runs({runs_[2], runs_[0]});
    EXPECT_EQ(canvas.impl().reference, runs_[2]);
}

}  // namespace
}  // namespace kv::views
