// The memory plot image against a per-pixel f64 reference: every pixel is the category whose
// stacked interval holds the value at the pixel's centre (blended over background and band),
// or the total line, or background; plus the image sizes, bands and the column -> bucket map.
#include <gtest/gtest.h>

#include <random>

#include "tests/support/test_support.h"
#include "views/memory_raster.h"

namespace kv::views {
namespace {

Colour pixel(const std::vector<uint8_t>& rgba, int w, int x, int y) {
    const size_t i = (size_t(y) * size_t(w) + size_t(x)) * 4;
    return pack_rgba(rgba[i], rgba[i + 1], rgba[i + 2], rgba[i + 3]);
}

storage::MemoryBucket random_bucket(std::mt19937_64& rng) {
    storage::MemoryBucket b;
    std::uniform_int_distribution<int> pick(0, 3);
    std::uniform_int_distribution<int64_t> bytes(1, 900'000);
    for (size_t c = 0; c < kNumMemCategories; ++c) {
        const int k = pick(rng);
        b.at_max[c] = k == 0 ? 0 : k == 1 ? -bytes(rng) / 4 : bytes(rng);  // absent, bogus negative, present
    }
    int64_t sum = 0;
    for (int64_t v : b.at_max) sum += std::max<int64_t>(0, v);
    b.total_max = sum;
    return b;
}

// What the pixel (x, y) must be, from the definition in memory_raster.h, in f64.
Colour expected_without_line(const storage::MemoryBucket& b, double ymax, int height, int y, Colour bg,
                             const MemoryRasterStyle& st) {
    const double v = (double(height - y) - 0.5) / double(height) * ymax;  // value at the pixel centre
    double base = 0;
    for (size_t c = 0; c < kNumMemCategories; ++c) {
        const double size = double(std::max<int64_t>(0, b.at_max[c]));
        if (size > 0 && base <= v && v < base + size)
            return blend_over(bg, with_alpha(mem_category_colour(MemCategory(c)), st.area_alpha));
        base += size;
    }
    return bg;
}

int line_row_from_bottom(const storage::MemoryBucket& b, double ymax, int height) {
    return std::clamp(int(std::floor(double(b.total_max) / ymax * height)), 0, height - 1);
}

TEST(MemoryRaster, EveryPixelMatchesTheStackedDefinition) {
    std::mt19937_64 rng(test::seed_for("MemoryRaster.EveryPixel"));
    const int w = 97, h = 61;
    std::vector<storage::MemoryBucket> buckets;
    int64_t peak = 0;
    for (int i = 0; i < w; ++i) buckets.push_back(random_bucket(rng)), peak = std::max(peak, buckets.back().total_max);
    const double ymax = double(peak) * 1.08;
    const std::vector<RasterBand> bands = {{10.0f, 30.0f, pack_rgba(255, 255, 255, 14)}, {30.0f, 50.5f, pack_rgba(120, 160, 255, 18)}};
    const MemoryRasterStyle st;
    std::vector<uint8_t> img;
    rasterize_memory_plot(buckets, ymax, bands, w, h, img, st);
    ASSERT_EQ(img.size(), size_t(w) * h * 4);
    int prev = -1, area_pixels = 0;
    for (int x = 0; x < w; ++x) {
        const Colour bg = x >= 10 && x < 30   ? blend_over(st.background, bands[0].colour)
                          : x >= 30 && x < 50  ? blend_over(st.background, bands[1].colour)
                                               : st.background;
        const int line = line_row_from_bottom(buckets[size_t(x)], ymax, h);
        const int lo = prev < 0 ? line : std::min(prev + (prev < line ? 1 : 0), line);
        const int hi = prev < 0 ? line : std::max(prev - (prev > line ? 1 : 0), line);
        for (int y = 0; y < h; ++y) {
            const int rb = h - 1 - y;
            Colour want = expected_without_line(buckets[size_t(x)], ymax, h, y, bg, st);
            if (want != bg) ++area_pixels;
            if (rb >= lo && rb <= hi) want = blend_over(want, st.total_line);
            ASSERT_EQ(pixel(img, w, x, y), want) << "column " << x << " row " << y;
            ASSERT_EQ(colour_a(pixel(img, w, x, y)), 255) << "the plot image is opaque";
        }
        prev = line;
    }
    EXPECT_GT(area_pixels, w * h / 4) << "the random stacks fill a good part of the plot";
}

TEST(MemoryRaster, ColumnsSampleBucketsAndEmptyInputIsBackground) {
    // 4 buckets over 8 columns: column x shows bucket x * 4 / 8.
    std::vector<storage::MemoryBucket> buckets(4);
    for (int i = 0; i < 4; ++i) {
        buckets[size_t(i)].at_max[size_t(MemCategory::KV_CACHE)] = (i + 1) * 100;
        buckets[size_t(i)].total_max = (i + 1) * 100;
    }
    std::vector<uint8_t> img;
    const MemoryRasterStyle st;
    rasterize_memory_plot(buckets, 500.0, {}, 8, 40, img, st);
    const Colour kv = blend_over(st.background, with_alpha(mem_category_colour(MemCategory::KV_CACHE), st.area_alpha));
    for (int x = 0; x < 8; ++x) {
        const int filled_rows = (x / 2 + 1) * 8;  // 100 bytes per 8 rows of 40 at ymax 500
        EXPECT_EQ(pixel(img, 8, x, 39), kv) << x;
        // even columns > 0 step up: the line's vertical run covers the area's top rows
        const bool step = x > 0 && x % 2 == 0;
        EXPECT_EQ(pixel(img, 8, x, 40 - filled_rows), step ? blend_over(kv, st.total_line) : kv) << x;
        if (step) {
            EXPECT_EQ(pixel(img, 8, x, 40 - filled_rows + 8), kv) << x << ": below the step's run";
        }
        EXPECT_EQ(pixel(img, 8, x, 39 - filled_rows), blend_over(st.background, st.total_line)) << x;
        EXPECT_EQ(pixel(img, 8, x, 38 - filled_rows), st.background) << x;
    }
    rasterize_memory_plot({}, 0.0, {}, 5, 3, img, st);
    ASSERT_EQ(img.size(), 5u * 3u * 4u);
    for (int y = 0; y < 3; ++y)
        for (int x = 0; x < 5; ++x) EXPECT_EQ(pixel(img, 5, x, y), st.background);
    rasterize_memory_plot(buckets, 400.0, {}, 0, 10, img, st);
    EXPECT_TRUE(img.empty());
}

TEST(MemoryRaster, BlendOverIsTheStandardAlphaFormula) {
    const Colour dst = pack_rgba(10, 200, 30), src = pack_rgba(250, 0, 130, 64);
    const Colour c = blend_over(dst, src);
    auto ref = [](int d, int s) { return int(std::lround((s * 64.0 + d * 191.0) / 255.0)); };
    EXPECT_EQ(colour_r(c), ref(10, 250));
    EXPECT_EQ(colour_g(c), ref(200, 0));
    EXPECT_EQ(colour_b(c), ref(30, 130));
    EXPECT_EQ(colour_a(c), 255);
    EXPECT_EQ(blend_over(dst, with_alpha(src, 255)), with_alpha(src, 255));
    EXPECT_EQ(blend_over(dst, with_alpha(src, 0)), dst);
}

}  // namespace
}  // namespace kv::views
