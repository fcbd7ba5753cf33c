#include "views/memory_raster.h"

#include <algorithm>
#include <cmath>
#include <array>
#include <cstring>

namespace kv::views {

Colour blend_over(Colour dst, Colour src) {
    const uint32_t a = colour_a(src);
    auto ch = [a](uint32_t d, uint32_t s) { return uint8_t((s * a + d * (255 - a) + 127) / 255); };
    return pack_rgba(ch(colour_r(dst), colour_r(src)), ch(colour_g(dst), colour_g(src)), ch(colour_b(dst), colour_b(src)),
                     uint8_t(std::max<uint32_t>(colour_a(dst), a)));
}

void rasterize_memory_plot(const std::vector<storage::MemoryBucket>& buckets, double ymax, const std::vector<RasterBand>& bands,
                           int width, int height, std::vector<uint8_t>& rgba, const MemoryRasterStyle& style) {
    width = std::max(width, 0), height = std::max(height, 0);
    rgba.resize(size_t(width) * size_t(height) * 4);
    if (width == 0 || height == 0) return;
    uint32_t* px = reinterpret_cast<uint32_t*>(rgba.data());
    const size_t stride = size_t(width);
    const size_t n = buckets.size();
    std::array<Colour, kNumMemCategories> area{};
    for (size_t c = 0; c < kNumMemCategories; ++c)
        area[c] = with_alpha(mem_category_colour(MemCategory(c)), style.area_alpha);
    const double to_px = ymax > 0 ? double(height) / ymax : 0.0;
    int prev_line = -1;
    // Column by column, rows counted from the bottom (rb); row rb sits at image row height-1-rb.
    for (int x = 0; x < width; ++x) {
        Colour bg = style.background;
        const float centre = float(x) + 0.5f;
        for (const RasterBand& b : bands)
            if (b.x0 <= centre && centre < b.x1) bg = blend_over(bg, b.colour);
        int filled = 0;  // rows [0, filled) from the bottom are painted
        auto paint = [&](int lo, int hi, Colour c) {
            lo = std::clamp(lo, 0, height), hi = std::clamp(hi, 0, height);
            for (int rb = lo; rb < hi; ++rb) px[size_t(height - 1 - rb) * stride + size_t(x)] = c;
        };
        if (n == 0 || to_px <= 0) {
            paint(0, height, bg);
            continue;
        }
        const storage::MemoryBucket& b = buckets[std::min(n - 1, size_t(x) * n / size_t(width))];
        double cum = 0;
        for (size_t c = 0; c < kNumMemCategories; ++c) {
            const double v = double(std::max<int64_t>(0, b.at_max[c]));
            if (v <= 0) continue;
            // rows whose centre value lies in [cum, cum + v): rb + 0.5 >= P0 and rb + 0.5 < P1
            const int lo = int(std::ceil(cum * to_px - 0.5));
            cum += v;
            const int hi = int(std::ceil(cum * to_px - 0.5));
            if (hi <= lo) continue;
            paint(filled, lo, bg);
            paint(lo, hi, blend_over(bg, area[c]));
            filled = std::max(filled, std::min(hi, height));
        }
        paint(filled, height, bg);
        // The total (max per column) as a step line.
        const int line = std::clamp(int(std::floor(double(b.total_max) * to_px)), 0, height - 1);
        const int from = prev_line < 0 ? line : (prev_line < line ? prev_line + 1 : line);
        const int to = prev_line < 0 ? line : (prev_line > line ? prev_line - 1 : line);
        for (int rb = from; rb <= to; ++rb) {
            uint32_t& p = px[size_t(height - 1 - rb) * stride + size_t(x)];
            p = blend_over(p, style.total_line);
        }
        prev_line = line;
    }
}

}  // namespace kv::views
