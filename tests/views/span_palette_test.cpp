// Span colours mean one thing: no span category colour (nor phase shade) is equal or close to a
// memory category colour, and the span categories are told apart among themselves. Distances are
// CIE76 (Euclidean in CIE L*a*b*, D65), computed here in f64 from the sRGB definition.
#include <gtest/gtest.h>

#include <cmath>

#include "views/colormap.h"

namespace kv::views {
namespace {

struct Lab {
    double l, a, b;
};

Lab to_lab(Colour c) {
    auto lin = [](uint8_t u) {
        const double v = u / 255.0;
        return v <= 0.04045 ? v / 12.92 : std::pow((v + 0.055) / 1.055, 2.4);
    };
    const double r = lin(colour_r(c)), g = lin(colour_g(c)), b = lin(colour_b(c));
    const double x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, y = 0.2126 * r + 0.7152 * g + 0.0722 * b,
                 z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883;
    auto f = [](double t) { return t > 216.0 / 24389.0 ? std::cbrt(t) : (24389.0 / 27.0 * t + 16.0) / 116.0; };
    return {116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))};
}

double delta_e(Colour p, Colour q) {
    const Lab a = to_lab(p), b = to_lab(q);
    return std::sqrt((a.l - b.l) * (a.l - b.l) + (a.a - b.a) * (a.a - b.a) + (a.b - b.b) * (a.b - b.b));
}

TEST(SpanPalette, NoSpanColourIsAMemoryColour) {
    for (size_t s = 0; s < trace::kNumSpanCategories; ++s)
        for (size_t m = 0; m < kNumMemCategories; ++m) {
            const Colour sc = span_category_colour(trace::SpanCategory(s)), mc = mem_category_colour(MemCategory(m));
            EXPECT_NE(sc & 0xFFFFFFu, mc & 0xFFFFFFu) << trace::span_category_name(trace::SpanCategory(s)) << " = " << mem_category_name(MemCategory(m));
            EXPECT_GE(delta_e(sc, mc), 20.0) << trace::span_category_name(trace::SpanCategory(s)) << " looks like "
                                             << mem_category_name(MemCategory(m));
        }
    for (bool kernel : {true, false})
        for (size_t m = 0; m < kNumMemCategories; ++m)
            EXPECT_GE(delta_e(gpu_work_colour(kernel), mem_category_colour(MemCategory(m))), 20.0) << (kernel ? "kernel" : "copy")
                                                                                                 << " looks like " << mem_category_name(MemCategory(m));
    for (int p = 0; p < 6; ++p)
        for (size_t m = 0; m < kNumMemCategories; ++m)
            EXPECT_GE(delta_e(phase_colour(p), mem_category_colour(MemCategory(m))), 20.0) << "phase " << p << " looks like "
                                                                                          << mem_category_name(MemCategory(m));
}

TEST(SpanPalette, SpanCategoriesAreToldApart) {
    for (size_t a = 0; a < trace::kNumSpanCategories; ++a)
        for (size_t b = a + 1; b < trace::kNumSpanCategories; ++b)
            EXPECT_GE(delta_e(span_category_colour(trace::SpanCategory(a)), span_category_colour(trace::SpanCategory(b))), 10.0)
                << trace::span_category_name(trace::SpanCategory(a)) << " vs " << trace::span_category_name(trace::SpanCategory(b));
    // The CIE76 reference itself: white to black is 100, a colour to itself 0.
    EXPECT_NEAR(delta_e(pack_rgba(255, 255, 255), pack_rgba(0, 0, 0)), 100.0, 0.01);
    EXPECT_EQ(delta_e(pack_rgba(12, 200, 7), pack_rgba(12, 200, 7)), 0.0);
}

}  // namespace
}  // namespace kv::views
