// The plot module: ticks are round (1, 2 or 5 times a power of ten; powers of two on log2 axes)
// and cover the data; figures come out as real SVG / PNG / PDF files whose polylines are the
// series under one affine mapping; bad input is refused with a message.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <tuple>
#include <sstream>
#include <stdexcept>

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

TEST(PlotRender, SvgPolylinesAreTheSeriesUnderOneAffineLog2Map) {
    const std::string path = tmp("svg");
    Figure f = sample();
    render_figure(f, path);
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    std::filesystem::remove(path);
    const std::string text = ss.str();
    ASSERT_NE(text.find("<svg"), std::string::npos);
    std::regex path_re(R"re(<path[^>]*d="([^"]*)")re");
    std::vector<std::vector<std::pair<double, double>>> four;  // 4-point polylines = the series
    for (auto it = std::sregex_iterator(text.begin(), text.end(), path_re); it != std::sregex_iterator(); ++it) {
        const std::string d = (*it)[1];
        if (d.find_first_of("CcZzQqAaHhVv") != std::string::npos) continue;
        std::istringstream ps(d);
        std::string cmd;
        std::vector<std::pair<double, double>> pts;
        int moves = 0;
        while (ps >> cmd) {
            double x, y;
            ps >> x >> y;
            moves += cmd == "M";
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

}  // namespace
}  // namespace kv::plot
