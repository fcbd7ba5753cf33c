// The plot module: ticks are round (1, 2 or 5 times a power of ten; powers of two on log2 axes)
// and cover the data; figures come out as real SVG / PNG / PDF files whose polylines are the
// series under one affine mapping; bad input is refused with a message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <map>
#include <fstream>
#include <regex>
#include <set>
#include <tuple>
#include <sstream>
#include <stdexcept>

#include "plot/heatmap.h"
#include "plot/palette.h"
#include "plot/render.h"
#include "plot/ticks.h"

namespace kv::plot {
namespace {

bool round_step(double step) {
    const double mag = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (std::fabs(step - m * mag) < 1e-9 * step) return true;
    return false;
}

TEST(PlotTicks, LinearTicksAreRoundAndCoverTheRange) {
    const std::pair<double, double> ranges[] = {{0, 1}, {15.59, 27.3}, {0.001, 0.0042}, {-3, 7}, {1234, 98765}, {5, 5}};
    for (auto [lo, hi] : ranges) {
        Ticks t = linear_ticks(lo, hi, 6);
        ASSERT_GE(t.values.size(), 2u) << lo << ".." << hi;
        EXPECT_LE(t.values.size(), 8u) << lo << ".." << hi;
        EXPECT_LE(t.lo, lo);
        EXPECT_GE(t.hi, hi);
        const double step = t.values[1] - t.values[0];
        EXPECT_TRUE(round_step(step)) << "step " << step << " for " << lo << ".." << hi;
        for (size_t i = 1; i < t.values.size(); ++i) EXPECT_NEAR(t.values[i] - t.values[i - 1], step, 1e-9 * std::fabs(step));
        for (double v : t.values) EXPECT_NEAR(std::remainder(v, step), 0.0, 1e-9 * std::max(1.0, std::fabs(v)));
    }
}

TEST(PlotTicks, IntegerTicksAreWholeNumbersCoveringTheRange) {
    EXPECT_EQ(integer_ticks(0, 1).values, (std::vector<double>{0, 1}));  // linear_ticks would step by 0.2
    EXPECT_EQ(integer_ticks(0, 3).values, (std::vector<double>{0, 1, 2, 3}));
    const Ticks many = integer_ticks(0, 29);  // 30 layers: a round step of whole numbers
    ASSERT_GE(many.values.size(), 2u);
    for (double v : many.values) EXPECT_EQ(v, std::floor(v)) << v;
    EXPECT_LE(many.lo, 0);
    EXPECT_GE(many.hi, 29);
    const Ticks one = integer_ticks(4, 4);  // one layer: whole ticks around it
    for (double v : one.values) EXPECT_EQ(v, std::floor(v)) << v;
    EXPECT_LE(one.lo, 4);
    EXPECT_GE(one.hi, 4);
}

TEST(PlotTicks, Log2TicksArePowersOfTwoInRange) {
    Ticks t = log2_ticks(200, 5000);
    EXPECT_EQ(t.values, (std::vector<double>{256, 512, 1024, 2048, 4096}));
    Ticks many = log2_ticks(1, 1 << 20, 8);  // 21 powers: thinned to every 4th
    EXPECT_LE(many.values.size(), 8u);
    for (double v : many.values) EXPECT_EQ(std::exp2(std::round(std::log2(v))), v);
    EXPECT_EQ(tick_label(0.25), "0.25");
    EXPECT_EQ(tick_label(4096), "4096");
}

std::string tmp(const std::string& ext) {
    return (std::filesystem::temp_directory_path() / ("kvlab-plot-test-" + std::to_string(::getpid()) + "." + ext)).string();
}

Figure sample() {
    Figure f;
    f.x_title = "cache length L (slots per layer)";
    f.y_title = "perplexity";
    f.log2_x = true;
    Panel p;
    p.series.push_back({"h2o", {256, 512, 1024, 2048}, {24.9, 20.7, 17.8, 16.2}});
    p.series.push_back({"lastrec", {2048, 256, 1024, 512}, {15.9, 17.4, 16.0, 16.5}});  // unsorted on purpose
    p.references.push_back({"dense", 15.59});
    f.panels.push_back(p);
    return f;
}

// Every "M x y L x y ..." path of an SVG as its list of (command, x, y).
std::vector<std::vector<std::tuple<char, double, double>>> svg_move_line_paths(const std::string& text) {
    std::vector<std::vector<std::tuple<char, double, double>>> out;
    std::regex path_re(R"re(<path[^>]*d="([^"]*)")re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_re); it != std::sregex_iterator(); ++it) {
        const std::string d = (*it)[1];
        if (d.find_first_of("CcZzQqAaHhVv") != std::string::npos) continue;
        std::istringstream ps(d);
        std::string cmd;
        std::vector<std::tuple<char, double, double>> p;
        while (ps >> cmd) {
            double x, y;
            ps >> x >> y;
            p.push_back({cmd[0], x, y});
        }
        out.push_back(p);
    }
    return out;
}

std::string read_and_remove(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::filesystem::remove(path);
    return ss.str();
}

TEST(PlotRender, SvgPolylinesAreTheSeriesUnderOneAffineLog2Map) {
    const std::string path = tmp("svg");
    Figure f = sample();
    render_figure(f, path);
    const std::string text = read_and_remove(path);
    ASSERT_NE(text.find("<svg"), std::string::npos);
    std::vector<std::vector<std::pair<double, double>>> four;  // 4-point polylines = the series
    for (const auto& q : svg_move_line_paths(text)) {
        std::vector<std::pair<double, double>> pts;
        int moves = 0;
        for (const auto& [cmd, x, y] : q) {
            moves += cmd == 'M';
            pts.push_back({x, y});
        }
        if (moves == 1 && pts.size() == 4) four.push_back(pts);
    }
    ASSERT_EQ(four.size(), 2u);
    // Fit px = a log2(x) + b and py = c y + e on the first series' ends, check everything else.
    const auto& s0 = f.panels[0].series[0];
    const double a = (four[0][3].first - four[0][0].first) / (std::log2(s0.x[3]) - std::log2(s0.x[0]));
    const double b = four[0][0].first - a * std::log2(s0.x[0]);
    const double c = (four[0][3].second - four[0][0].second) / (s0.y[3] - s0.y[0]);
    const double e = four[0][0].second - c * s0.y[0];
    EXPECT_GT(a, 0);
    EXPECT_LT(c, 0);  // larger values higher on the page
    for (size_t k = 0; k < 2; ++k) {
        auto s = f.panels[0].series[k];
        std::vector<size_t> order = {0, 1, 2, 3};
        std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return s.x[i] < s.x[j]; });  // drawn left to right
        for (size_t i = 0; i < 4; ++i) {
            EXPECT_NEAR(four[k][i].first, a * std::log2(s.x[order[i]]) + b, 0.01) << s.label << " point " << i;
            EXPECT_NEAR(four[k][i].second, c * s.y[order[i]] + e, 0.01) << s.label << " point " << i;
        }
    }
}

std::string render_svg(const Figure& f) {
    const std::string path = tmp("svg");
    render_figure(f, path);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::filesystem::remove(path);
    return ss.str();
}

// (style, points) of every stroked path whose d is only M/L/Z commands.
struct SvgPath {
    std::string style;
    std::vector<std::pair<double, double>> pts;
    bool closed = false;
};
std::vector<SvgPath> stroked_paths(const std::string& text) {
    std::vector<SvgPath> out;
    std::regex path_re(R"re(<path style="([^"]*)" d="([^"]*)")re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_re); it != std::sregex_iterator(); ++it) {
        const std::string style = (*it)[1], d = (*it)[2];
        if (style.find("stroke:none") != std::string::npos || d.find_first_of("CcQqAaHhVv") != std::string::npos) continue;
        SvgPath p;
        p.style = style;
        std::istringstream ps(d);
        std::string cmd;
        while (ps >> cmd) {
            if (cmd == "Z") {
                p.closed = true;
                continue;
            }
            double x, y;
            ps >> x >> y;
            p.pts.push_back({x, y});
        }
        out.push_back(p);
    }
    return out;
}

// A reference line at the data's maximum (dense kept mass 1.0, the top tick) is drawn strictly
// inside the frame, not on its top edge; the frame is the closed rectangle of the panel's size.
TEST(PlotRender, ReferenceLineAtTheDataMaximumIsInsideTheFrame) {
    Figure f;
    f.x_title = "cache length";
    f.y_title = "kept mass";
    f.log2_x = true;
    Panel p;
    p.series.push_back({"h2o", {192, 256, 384, 768}, {0.37, 0.45, 0.58, 0.86}});
    p.references.push_back({"dense", 1.0});
    f.panels.push_back(p);
    const std::vector<SvgPath> paths = stroked_paths(render_svg(f));
    const SvgPath* frame = nullptr;
    const SvgPath* dense = nullptr;
    for (const SvgPath& q : paths) {
        if (q.closed && q.pts.size() >= 4 && std::fabs(q.pts[1].first - q.pts[0].first - f.panel_width) < 1e-6) frame = &q;
        // the panel's dashed line starts at the frame's left edge (the legend's sample is further right)
        if (q.style.find("stroke-dasharray:6,3") != std::string::npos && q.pts.size() == 2 && (!dense || q.pts[0].first < dense->pts[0].first))
            dense = &q;
    }
    ASSERT_NE(frame, nullptr);
    ASSERT_NE(dense, nullptr);
    const double top = std::min(frame->pts[0].second, frame->pts[2].second), bottom = std::max(frame->pts[0].second, frame->pts[2].second);
    EXPECT_NEAR(bottom - top, f.panel_height, 1e-6);
    EXPECT_EQ(dense->pts[0].second, dense->pts[1].second);  // horizontal
    EXPECT_GT(dense->pts[0].second, top + 2) << "the dense line lies on (or above) the frame's top edge";
    EXPECT_LT(dense->pts[0].second, bottom);
    // every series point is inside too
    for (const SvgPath& q : paths)
        if (q.style.find("stroke-width:1.8") != std::string::npos && q.pts.size() == 4)
            for (auto [x, y] : q.pts) {
                EXPECT_TRUE(y > top && y < bottom) << y;
            }
}

// Tick labels under the frame, read back from cairo's glyph placements (<use> elements on one
// baseline): clusters of glyphs 1 advance apart, as (first x, last x, glyph ids).
struct GlyphLabel {
    double x0, x1;
    std::vector<std::string> glyphs;
};
std::vector<GlyphLabel> x_tick_labels(const std::string& text, double frame_left, double frame_bottom) {
    std::regex use_re(R"re(<use xlink:href="#([^"]*)" x="([^"]*)" y="([^"]*)")re");
    std::vector<std::tuple<double, double, std::string>> row;  // (y, x, glyph)
    for (auto it = std::sregex_iterator(text.begin(), text.end(), use_re); it != std::sregex_iterator(); ++it) {
        const double x = std::stod((*it)[2]), y = std::stod((*it)[3]);
        // below the frame (the y labels sit left of it, the x title further down)
        if (y > frame_bottom && y < frame_bottom + 25 && x > frame_left) row.push_back({y, x, (*it)[1]});
    }
    std::sort(row.begin(), row.end(), [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
    std::vector<GlyphLabel> out;
    for (const auto& [y, x, g] : row) {
        EXPECT_NEAR(y, std::get<0>(row[0]), 1e-6) << "tick labels on different baselines";
        if (out.empty() || x - out.back().x1 > 9) out.push_back({x, x, {}});  // a digit advances 7 points at this size
        out.back().x1 = x;
        out.back().glyphs.push_back(g);
    }
    return out;
}

// On the log2 x axis every x value of the data gets a label when there are few (768 and 1536
// too, not only powers of two); labels never overlap; their centres sit on the series' points.
TEST(PlotRender, Log2AxisLabelsEveryDataValueWithoutOverlap) {
    Figure f;
    f.x_title = "cache length";
    f.y_title = "perplexity";
    f.log2_x = true;
    Panel p;
    const std::vector<double> xs = {256, 512, 768, 1024, 1536, 2048};
    p.series.push_back({"h2o", xs, {30, 25, 22, 20, 18, 17}});
    f.panels.push_back(p);
    const std::string text = render_svg(f);
    const std::vector<SvgPath> paths = stroked_paths(text);
    const SvgPath* frame = nullptr;
    const SvgPath* line = nullptr;
    for (const SvgPath& q : paths) {
        if (q.closed && q.pts.size() >= 4) frame = &q;
        if (q.style.find("stroke-width:1.8") != std::string::npos && q.pts.size() == xs.size() && !line) line = &q;
    }
    ASSERT_NE(frame, nullptr);
    ASSERT_NE(line, nullptr);
    const std::vector<GlyphLabel> labels = x_tick_labels(text, frame->pts[0].first, std::max(frame->pts[0].second, frame->pts[2].second));
    ASSERT_EQ(labels.size(), xs.size());
    // Same glyph for the same digit across labels, different glyphs for different digits.
    std::map<char, std::string> glyph_of;
    std::map<std::string, char> digit_of;
    for (size_t i = 0; i < xs.size(); ++i) {
        const std::string want = std::to_string(int(xs[i]));
        ASSERT_EQ(labels[i].glyphs.size(), want.size()) << "label " << i << " should read " << want;
        for (size_t k = 0; k < want.size(); ++k) {
            auto [g, fresh] = glyph_of.insert({want[k], labels[i].glyphs[k]});
            EXPECT_EQ(g->second, labels[i].glyphs[k]) << "digit " << want[k] << " in label " << want;
            auto [d, fresh2] = digit_of.insert({labels[i].glyphs[k], want[k]});
            EXPECT_EQ(d->second, want[k]) << "glyph " << labels[i].glyphs[k] << " in label " << want;
        }
        // centred on the point (a digit is 7 points wide: the centre is 3.5 past the middle glyph origins)
        const double centre = (labels[i].x0 + labels[i].x1 + 7) / 2;
        EXPECT_NEAR(centre, line->pts[i].first, 2.0) << "label " << want;
        if (i > 0) {
            EXPECT_GT(labels[i].x0, labels[i - 1].x1 + 7) << "labels " << i - 1 << " and " << i << " overlap";
        }
    }
    // Values too close to label both: the later one is left out, nothing overlaps.
    f.panels[0].series[0] = {"h2o", {256, 1000, 1024, 2048}, {30, 25, 22, 20}};
    const std::vector<GlyphLabel> close = x_tick_labels(render_svg(f), frame->pts[0].first, std::max(frame->pts[0].second, frame->pts[2].second));
    ASSERT_EQ(close.size(), 3u);
    EXPECT_EQ(close[1].glyphs.size(), 4u);  // "1000"
    for (size_t i = 1; i < close.size(); ++i) EXPECT_GT(close[i].x0, close[i - 1].x1 + 7);
    // More than ten values: powers of two only.
    Ticks many = log2_data_ticks({100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100}, 64, 2048);
    for (double v : many.values) EXPECT_EQ(std::exp2(std::round(std::log2(v))), v);
    EXPECT_EQ(log2_data_ticks({768, 1536, 768}, 512, 2048).values, (std::vector<double>{768, 1536}));
}

TEST(PlotStyle, FourteenSeriesGetFourteenDistinctStyles) {
    std::set<std::tuple<double, double, double, std::vector<double>, int>> seen;
    std::set<std::pair<std::tuple<double, double, double>, int>> colour_marker;
    for (size_t i = 0; i < 14; ++i) {
        const SeriesStyle s = series_style(i);
        seen.insert({s.color.r, s.color.g, s.color.b, s.dash, int(s.marker)});
        colour_marker.insert({{s.color.r, s.color.g, s.color.b}, int(s.marker)});
        for (double d : s.dash) EXPECT_GT(d, 0) << "series " << i;
        EXPECT_NE(s.dash, (std::vector<double>{6, 3})) << "series " << i << " dashed like the reference lines";
    }
    EXPECT_EQ(seen.size(), 14u);
    EXPECT_EQ(colour_marker.size(), 14u);  // apart even where dashes do not show (short segments)
}

// The rendered SVG draws 14 series as 14 polylines of pairwise different (stroke colour, dash
// pattern), and each polyline's points are still its series' values under one mapping.
TEST(PlotRender, FourteenSeriesAreDrawnInDistinctStrokes) {
    Figure f;
    f.x_title = "cache length";
    f.y_title = "perplexity";
    f.log2_x = true;
    Panel p;
    for (int i = 0; i < 14; ++i) p.series.push_back({"policy" + std::to_string(i), {256, 512, 1024}, {30.0 - i, 20.0 - i * 0.5, 16.0 - i * 0.1}});
    p.references.push_back({"dense", 15.59});
    f.panels.push_back(p);
    const std::string path = tmp("svg");
    render_figure(f, path);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::filesystem::remove(path);
    const std::string text = ss.str();
    std::regex path_re(R"re(<path([^>]*)>)re"), d_re(R"re(\bd="([^"]*)")re"), stroke_re(R"re([;" ]stroke:([^;"]*))re"),
        dash_re(R"re(stroke-dasharray:([^;"]*))re");  // cairo writes the style as CSS
    std::vector<std::pair<std::string, std::string>> strokes;  // (colour, dash) of the 3-point polylines
    std::vector<std::vector<std::pair<double, double>>> lines;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_re); it != std::sregex_iterator(); ++it) {
        const std::string attrs = (*it)[1];
        std::smatch d, st, da;
        if (!std::regex_search(attrs, d, d_re) || !std::regex_search(attrs, st, stroke_re)) continue;
        const std::string ds = d[1];
        if (ds.find_first_of("CcZzQqAaHhVv") != std::string::npos) continue;
        std::istringstream ps(ds);
        std::string cmd;
        std::vector<std::pair<double, double>> pts;
        int moves = 0;
        while (ps >> cmd) {
            double x, y;
            ps >> x >> y;
            moves += cmd == "M";
            pts.push_back({x, y});
        }
        if (moves != 1 || pts.size() != 3) continue;
        strokes.push_back({st[1], std::regex_search(attrs, da, dash_re) ? std::string(da[1]) : std::string("solid")});
        lines.push_back(pts);
    }
    ASSERT_EQ(strokes.size(), 14u);
    const std::set<std::pair<std::string, std::string>> distinct(strokes.begin(), strokes.end());
    EXPECT_EQ(distinct.size(), 14u);
    // Same affine map for every series: fit on series 0, check the rest.
    const double a = (lines[0][2].first - lines[0][0].first) / 2.0, b = lines[0][0].first - a * 8;
    const double c = (lines[0][2].second - lines[0][0].second) / (16.0 - 30.0), e = lines[0][0].second - c * 30.0;
    for (size_t k = 0; k < 14; ++k)
        for (size_t i = 0; i < 3; ++i) {
            EXPECT_NEAR(lines[k][i].first, a * std::log2(p.series[k].x[i]) + b, 0.01) << "series " << k;
            EXPECT_NEAR(lines[k][i].second, c * p.series[k].y[i] + e, 0.01) << "series " << k;
        }
}

TEST(PlotHeatmap, ColourRunsRedYellowGreenAndClamps) {
    double lo[3], mid[3], hi[3], below[3], above[3];
    heatmap_colour(0, 0, 1, lo);
    heatmap_colour(0.5, 0, 1, mid);
    heatmap_colour(1, 0, 1, hi);
    heatmap_colour(-3, 0, 1, below);
    heatmap_colour(7, 0, 1, above);
    EXPECT_GT(lo[0], lo[1]);   // red: lost
    EXPECT_GT(hi[1], hi[0]);   // green: found
    EXPECT_GT(mid[0], 0.9);    // yellow between
    EXPECT_GT(mid[1], 0.8);
    for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(below[c], lo[c]);
        EXPECT_EQ(above[c], hi[c]);
    }
}

TEST(PlotHeatmap, WritesEveryFormatAndRefusesAGridThatDoesNotMatchItsLabels) {
    Heatmap h;
    h.x_labels = {"1024", "2048"};
    h.y_labels = {"0", "0.5", "1"};
    h.panels.push_back({"h2o", {{1, 0.5}, {NAN, 0}, {1, 1}}});
    for (const char* ext : {"svg", "png", "pdf"}) {
        const std::string path = tmp(ext);
        render_heatmap(h, path);
        EXPECT_GT(std::filesystem::file_size(path), 200u) << ext;
        std::filesystem::remove(path);
    }
    Heatmap bad = h;
    bad.panels[0].values.pop_back();  // 2 rows for 3 labels
    EXPECT_THROW(render_heatmap(bad, tmp("svg")), std::invalid_argument);
    bad = h;
    bad.panels[0].values[1].push_back(1);  // a row of 3 cells for 2 columns
    EXPECT_THROW(render_heatmap(bad, tmp("svg")), std::invalid_argument);
    EXPECT_THROW(render_heatmap(h, "map.txt"), std::invalid_argument);
}

TEST(PlotRender, PngAndPdfAreWritten) {
    for (const char* ext : {"png", "pdf"}) {
        const std::string path = tmp(ext);
        render_figure(sample(), path);
        std::ifstream in(path, std::ios::binary);
        char head[4] = {};
        in.read(head, 4);
        std::filesystem::remove(path);
        const std::string magic = std::string(ext) == "png" ? std::string(head + 1, 3) : std::string(head, 4);
        EXPECT_EQ(magic, std::string(ext) == "png" ? "PNG" : "%PDF");
    }
}

TEST(PlotRender, BadInputIsRefused) {
    EXPECT_THROW(render_figure(sample(), tmp("jpg")), std::invalid_argument);
    EXPECT_THROW(render_figure(Figure{}, tmp("svg")), std::invalid_argument);
    Figure f = sample();
    f.panels[0].series[0].x[0] = 0;  // log2 of 0
    EXPECT_THROW(render_figure(f, tmp("svg")), std::invalid_argument);
    EXPECT_THROW(render_figure(sample(), "/nonexistent-dir/x.svg"), std::runtime_error);
}

// A title wider than the panels and legend labels longer than the legend's default room stay on
// the canvas: every glyph cairo places (its <use> origin) lies inside the SVG's width, the
// longest label's glyphs included.
TEST(PlotRender, LongTitleAndLegendLabelsStayOnTheCanvas) {
    Figure f;
    f.title = "SmolLM2-135M, repeat task (2048 tokens, passage at the start, two samples per cell): every policy";
    f.x_title = "cache length";
    f.y_title = "copied tokens";
    f.log2_x = true;
    Panel p;
    p.series.push_back({"ada-expected-attention-default", {256, 512, 1024}, {0.02, 0.1, 0.03}});
    p.series.push_back({"h2o", {256, 512, 1024}, {0.14, 0.22, 0.41}});
    p.references.push_back({"dense", 0.86});
    f.panels.push_back(p);
    const std::string text = render_svg(f);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex(R"re(<svg[^>]*width="([0-9.]+)(pt)?")re")));
    const double width = std::stod(m[1]);
    std::regex use_re(R"re(<use xlink:href="#[^"]*" x="([^"]*)" y="([^"]*)")re");
    int glyphs = 0;
    double rightmost = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), use_re); it != std::sregex_iterator(); ++it, ++glyphs) {
        const double x = std::stod((*it)[1]);
        EXPECT_GE(x, 0.0) << "a glyph left of the canvas";
        EXPECT_LE(x + 6, width) << "a glyph past the canvas's right edge (width " << width << ")";
        rightmost = std::max(rightmost, x);
    }
    EXPECT_GT(glyphs, 100) << "the title and labels should be drawn as glyphs";
    EXPECT_GT(rightmost, width - 60) << "the longest legend label should reach near the right edge, not be cut";
}

}  // namespace
}  // namespace kv::plot

namespace kv::plot {
namespace {

TEST(PlotRender, StandardErrorBarsSpanTheMeanPlusMinusSe) {
    // One series of three points, the middle one with s.e. 0.5: one bar path (vertical line and
    // two caps, three moves), its ends at y +- se under the same affine map as the polyline.
    Figure f;
    f.x_title = "x";
    f.y_title = "y";
    Panel p;
    p.series.push_back({"a", {1, 2, 3}, {1.0, 2.0, 4.0}, {0.0, 0.5, 0.0}});
    f.panels.push_back(p);
    f.notes = {"1 point is the mean of repeated runs; bars: +-1 standard error"};
    const std::string path = tmp("svg");
    render_figure(f, path);
    const auto paths = svg_move_line_paths(read_and_remove(path));
    const std::vector<std::tuple<char, double, double>>* line = nullptr;
    const std::vector<std::tuple<char, double, double>>* bar = nullptr;
    for (const auto& q : paths) {
        int moves = 0;
        for (const auto& c : q) moves += std::get<0>(c) == 'M';
        if (moves == 1 && q.size() == 3) line = &q;
        if (moves == 3 && q.size() == 6) bar = &q;
    }
    ASSERT_TRUE(line) << "the series' polyline";
    ASSERT_TRUE(bar) << "one error bar: a vertical line and two caps";
    // y pixel = a * y + b from the polyline's first and last points (y 1 and 4); cairo keeps
    // coordinates in 24.8 fixed point, so each is within 1/256 of a point
    const double tol = 4.0 / 256.0;
    const double a = (std::get<2>((*line)[2]) - std::get<2>((*line)[0])) / 3.0, b = std::get<2>((*line)[0]) - a;
    EXPECT_NEAR(std::get<1>((*bar)[0]), std::get<1>((*line)[1]), 1e-6) << "the bar stands at the middle point's x";
    EXPECT_NEAR(std::get<1>((*bar)[1]), std::get<1>((*line)[1]), 1e-6);
    EXPECT_NEAR(std::get<2>((*bar)[0]), a * 1.5 + b, tol) << "lower end at mean - se";
    EXPECT_NEAR(std::get<2>((*bar)[1]), a * 2.5 + b, tol) << "upper end at mean + se";
    // One s.e. per point or none; never negative.
    Figure bad = f;
    bad.panels[0].series[0].se = {0.5};
    EXPECT_THROW(render_figure(bad, tmp("svg")), std::invalid_argument);
    bad.panels[0].series[0].se = {0.0, -0.5, 0.0};
    EXPECT_THROW(render_figure(bad, tmp("svg")), std::invalid_argument);
}

}  // namespace
}  // namespace kv::plot
