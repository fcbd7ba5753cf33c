// The series styles (see palette.h).
#include "palette.h"

namespace kv::plot {

namespace {
constexpr size_t kColors = 7, kMarkers = 5, kDashes = 4;
}

Rgb series_color(size_t i) {
    static const Rgb kPalette[kColors] = {
        {0.000, 0.447, 0.698},  // blue
        {0.835, 0.369, 0.000},  // vermillion
        {0.000, 0.620, 0.451},  // bluish green
        {0.800, 0.475, 0.655},  // reddish purple
        {0.902, 0.624, 0.000},  // orange
        {0.337, 0.706, 0.914},  // sky blue
        {0.941, 0.894, 0.259},  // yellow
    };
    return kPalette[i % kColors];
}

SeriesStyle series_style(size_t i) {
    // Solid first; then patterns unlike the reference lines' even 6-3 dash (which are grey).
    static const std::vector<double> kDash[kDashes] = {{}, {8, 2.5, 1.5, 2.5}, {1.5, 2}, {12, 3}};
    SeriesStyle s;
    s.color = series_color(i);
    s.dash = kDash[(i / kColors) % kDashes];
    s.marker = Marker(i % kMarkers);
    return s;
}

}  // namespace kv::plot
