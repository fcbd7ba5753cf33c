// Colour map and category colours (see colormap.h).
#include "views/colormap.h"

#include <array>
#include <cmath>

namespace kv::views {

namespace {

// OKLab (L, a, b) -> linear sRGB, with the published OKLab matrices.
void oklab_to_linear_srgb(double L, double a, double b, double rgb[3]) {
    const double l_ = L + 0.3963377774 * a + 0.2158037573 * b;
    const double m_ = L - 0.1055613458 * a - 0.0638541728 * b;
    const double s_ = L - 0.0894841775 * a - 1.2914855480 * b;
    const double l = l_ * l_ * l_, m = m_ * m_ * m_, s = s_ * s_ * s_;
    rgb[0] = +4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s;
    rgb[1] = -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s;
    rgb[2] = -0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s;
}

double srgb_encode(double x) {  // linear -> sRGB transfer
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    return x <= 0.0031308 ? 12.92 * x : 1.055 * std::pow(x, 1 / 2.4) - 0.055;
}

double srgb_decode(double x) {
    return x <= 0.04045 ? x / 12.92 : std::pow((x + 0.055) / 1.055, 2.4);
}

bool in_gamut(const double rgb[3]) {
    const double eps = 1e-6;
    return rgb[0] >= -eps && rgb[0] <= 1 + eps && rgb[1] >= -eps && rgb[1] <= 1 + eps && rgb[2] >= -eps &&
           rgb[2] <= 1 + eps;
}

std::array<Colour, 256> build_table() {
    std::array<Colour, 256> t{};
    const double kPi = 3.14159265358979323846;
    for (int i = 0; i < 256; ++i) {
        const double u = i / 255.0;
        const double L = 0.28 + 0.66 * u;
        const double hue = (285.0 - 180.0 * u) * kPi / 180.0;  // violet-blue -> teal -> yellow
        const double want_chroma = 0.10 + 0.07 * u;
        // Largest chroma <= want_chroma that is inside sRGB at this lightness and hue, so
        // lightness is never traded away for saturation.
        double lo = 0, hi = want_chroma, rgb[3];
        oklab_to_linear_srgb(L, hi * std::cos(hue), hi * std::sin(hue), rgb);
        if (!in_gamut(rgb)) {
            for (int it = 0; it < 40; ++it) {
                const double mid = 0.5 * (lo + hi);
                oklab_to_linear_srgb(L, mid * std::cos(hue), mid * std::sin(hue), rgb);
                (in_gamut(rgb) ? lo : hi) = mid;
            }
            hi = lo;
        }
        oklab_to_linear_srgb(L, hi * std::cos(hue), hi * std::sin(hue), rgb);
        auto q = [](double v) { return uint8_t(std::lround(srgb_encode(v) * 255.0)); };
        t[size_t(i)] = pack_rgba(q(rgb[0]), q(rgb[1]), q(rgb[2]));
        // 8-bit rounding and OKLab lightness vs. luminance can leave a step of ~1e-4 going the
        // wrong way; lift green (the channel luminance weighs most) until it rises strictly.
        while (i > 0 && colour_luminance(t[size_t(i)]) <= colour_luminance(t[size_t(i - 1)]) &&
               colour_g(t[size_t(i)]) < 255) {
            const Colour c = t[size_t(i)];
            t[size_t(i)] = pack_rgba(colour_r(c), uint8_t(colour_g(c) + 1), colour_b(c));
        }
    }
    return t;
}

const std::array<Colour, 256>& table() {
    static const std::array<Colour, 256> t = build_table();  // immutable, built once
    return t;
}

// One colour per MemCategory, in enum order.
constexpr Colour kMemColours[] = {
    pack_rgba(110, 120, 140),  // weights: neutral slate (always there, should not shout)
    pack_rgba(66, 146, 235),   // kv_cache: blue
    pack_rgba(140, 100, 230),  // kv_checkpoint: violet
    pack_rgba(232, 112, 200),  // activation_checkpoint: pink
    pack_rgba(240, 150, 50),   // activations: orange
    pack_rgba(220, 70, 70),    // gradients: red
    pack_rgba(90, 190, 110),   // optimizer: green
    pack_rgba(200, 190, 80),   // workspace: olive
    pack_rgba(70, 200, 200),   // kv_offload: cyan
    pack_rgba(150, 150, 230),  // kv_fidelity: pale blue (a shadow of kv_cache)
    pack_rgba(30, 90, 170),    // kv_quant_scales: dark blue (beside kv_cache's packed codes)
    pack_rgba(120, 200, 250),  // kv_residual: light blue (KIVI's full-precision window)
};
static_assert(sizeof(kMemColours) / sizeof(kMemColours[0]) == kNumMemCategories,
              "memory category colours out of date with MemCategory");

// One colour per SpanCategory, in enum order. A palette of its own so a colour means one thing
// across views: none is near a memory category's (CIE76 distance >= 20, checked by a test), the
// structure (run > cell > layer > chunk) in warm greys lightening with depth, the ops in light
// tints (dark labels on them) or deep earth tones, never the saturated mid tones memory uses.
constexpr Colour kSpanColours[] = {
    pack_rgba(62, 58, 54),     // run: darkest warm grey
    pack_rgba(92, 84, 76),     // cell
    pack_rgba(124, 112, 100),  // layer
    pack_rgba(158, 146, 132),  // chunk
    pack_rgba(255, 200, 120),  // attention: apricot
    pack_rgba(178, 222, 140),  // mlp: pistachio
    pack_rgba(240, 228, 170),  // norm: cream
    pack_rgba(250, 170, 150),  // cache_update: salmon
    pack_rgba(232, 196, 250),  // scoring: lilac
    pack_rgba(160, 110, 60),   // quantize: brown
    pack_rgba(200, 150, 100),  // dequantize: tan
    pack_rgba(110, 70, 120),   // checkpoint_copy: plum
    pack_rgba(196, 236, 226),  // head: mint
    pack_rgba(140, 40, 60),    // backward: burgundy
    pack_rgba(40, 110, 90),    // optimizer: pine
    pack_rgba(205, 205, 195),  // io: stone
    pack_rgba(120, 130, 100),  // other: moss
};
static_assert(sizeof(kSpanColours) / sizeof(kSpanColours[0]) == trace::kNumSpanCategories,
              "span category colours out of date with SpanCategory");

// The run's phases (RUN spans nest: fidelity's reference pass inside the policy pass), told
// apart by shade within the span palette's sand family, away from memory and series colours.
constexpr Colour kPhaseColours[] = {
    pack_rgba(214, 196, 160), pack_rgba(176, 150, 112), pack_rgba(236, 222, 196), pack_rgba(140, 120, 90),
    pack_rgba(196, 176, 140), pack_rgba(104, 92, 72),
};

constexpr Colour kSeriesColours[] = {
    pack_rgba(66, 146, 235), pack_rgba(240, 150, 50),  pack_rgba(90, 190, 110), pack_rgba(220, 70, 70),
    pack_rgba(160, 110, 230), pack_rgba(70, 200, 200), pack_rgba(232, 112, 200), pack_rgba(200, 190, 80),
};

}  // namespace

const Colour* colormap_table() { return table().data(); }

Colour colormap(float t) {
    if (std::isnan(t)) return kNoDataColour;
    const float c = t < 0 ? 0.f : t > 1 ? 1.f : t;
    return table()[size_t(std::lround(c * 255.f))];
}

Colour mem_category_colour(MemCategory c) {
    return size_t(c) < kNumMemCategories ? kMemColours[size_t(c)] : pack_rgba(128, 128, 128);
}

Colour span_category_colour(trace::SpanCategory c) {
    return size_t(c) < trace::kNumSpanCategories ? kSpanColours[size_t(c)] : pack_rgba(128, 128, 128);
}

Colour phase_colour(int i) {
    const int n = int(sizeof(kPhaseColours) / sizeof(kPhaseColours[0]));
    return kPhaseColours[((i % n) + n) % n];
}

Colour gpu_work_colour(bool kernel) {
    // Teal-grey and rose: apart from the span palette and from every memory colour (tested).
    return kernel ? pack_rgba(96, 150, 140) : pack_rgba(180, 120, 150);
}

Colour series_colour(int i) {
    const int n = int(sizeof(kSeriesColours) / sizeof(kSeriesColours[0]));
    return kSeriesColours[((i % n) + n) % n];
}

double colour_luminance(Colour c) {
    return 0.2126 * srgb_decode(colour_r(c) / 255.0) + 0.7152 * srgb_decode(colour_g(c) / 255.0) +
           0.0722 * srgb_decode(colour_b(c) / 255.0);
}

}  // namespace kv::views
