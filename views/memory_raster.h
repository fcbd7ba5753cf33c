// The memory timeline's plot as one RGBA image: background, cell bands, the categories' stacked
// areas and the device total as a step line, one pixel column per bucket. Why an image: drawn
// as ImGui rectangles the stack is ~20k one-pixel-wide triangles per frame, and Mesa's llvmpipe
// spends ~25 ms setting those up; one textured quad costs it ~1 ms. Composited here (opaque),
// so the plot is a single layer of fill.
#pragma once

#include <cstdint>
#include <vector>

#include "storage/rows.h"
#include "views/colormap.h"

namespace kv::views {

// A background band over pixel columns [x0, x1) (a cell of the gradient pipeline), painted over
// the background with its colour's alpha.
struct RasterBand {
    float x0 = 0, x1 = 0;
    Colour colour = 0;
};

struct MemoryRasterStyle {
    Colour background = kNoDataColour;
    uint8_t area_alpha = 210;                       // categories' alpha over background and bands
    Colour total_line = pack_rgba(240, 240, 240, 200);  // the device total (max per column)
};

// Value -> pixel rows: row 0 is the top; a pixel holds the value at its centre, so category k
// of a column covers the rows whose centre value v satisfies base_k <= v < base_k + at_max[k]
// (categories stacked in enum order from 0). Column x shows bucket x * n / width. The total
// line marks, per column, the row holding total_max (clamped into the image), joined to the
// previous column's row by a vertical run in this column.
// Writes width * height RGBA8 pixels (row-major, opaque) into `rgba`.
void rasterize_memory_plot(const std::vector<storage::MemoryBucket>& buckets, double ymax, const std::vector<RasterBand>& bands,
                           int width, int height, std::vector<uint8_t>& rgba, const MemoryRasterStyle& style = {});

// `src` over `dst` with src's alpha (result opaque when dst is).
Colour blend_over(Colour dst, Colour src);

}  // namespace kv::views
