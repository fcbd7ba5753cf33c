// Colours shared by every view: a perceptual sequential colour map (dark blue-violet -> teal ->
// yellow, lightness rising monotonically, derived here from the OKLab colour space) and fixed
// colours per memory category, span category and series. Pure functions; no ImGui state.
// Colours are packed like IM_COL32 (R in the low byte), so the same value is both an ImDrawList
// colour and, stored little-endian, one RGBA8 texture pixel.
#pragma once

#include <cstdint>

#include "storage/rows.h"  // the record vocabulary: MemCategory, trace event types

namespace kv::views {

using Colour = uint32_t;  // IM_COL32 layout: A << 24 | B << 16 | G << 8 | R

constexpr Colour pack_rgba(uint8_t r, uint8_t g, uint8_t b, uint8_t a = 255) {
    return Colour(r) | Colour(g) << 8 | Colour(b) << 16 | Colour(a) << 24;
}
inline uint8_t colour_r(Colour c) { return uint8_t(c); }
inline uint8_t colour_g(Colour c) { return uint8_t(c >> 8); }
inline uint8_t colour_b(Colour c) { return uint8_t(c >> 16); }
inline uint8_t colour_a(Colour c) { return uint8_t(c >> 24); }
inline Colour with_alpha(Colour c, uint8_t a) { return (c & 0x00FFFFFFu) | Colour(a) << 24; }

// The sequential map at t in [0, 1] (clamped; NaN gives kNoDataColour). 256 entries computed
// once: OKLab lightness 0.28 -> 0.94 linear in t, hue turning from violet-blue through teal to
// yellow, chroma reduced just enough to stay inside sRGB, so lightness (and luminance) rises
// monotonically and equal steps in t look like equal steps in colour.
Colour colormap(float t);
// The 256-entry table itself (for textures built in bulk).
const Colour* colormap_table();
// Background for "nothing here" texels (absent tokens, empty slots).
constexpr Colour kNoDataColour = pack_rgba(24, 24, 28, 255);

// Fixed, distinguishable colours (tables static_assert'ed against the enums' COUNT).
Colour mem_category_colour(MemCategory c);
// Span categories have a palette of their own, apart from the memory categories' (a colour
// means one thing in every view); phases (RUN spans) are told apart by phase_colour (cycles).
Colour span_category_colour(trace::SpanCategory c);
Colour phase_colour(int i);
// GPU work on the trace view's device lanes: kernels, and copies or sets.
Colour gpu_work_colour(bool kernel);
// Series i of a plot or of compared runs (cycles after 8).
Colour series_colour(int i);

// Relative luminance (0..1) of a colour, for tests and for picking legible text colours.
double colour_luminance(Colour c);

}  // namespace kv::views
