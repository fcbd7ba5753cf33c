// The series palette (see palette.h).
#include "palette.h"

namespace kv::plot {

Rgb series_color(size_t i) {
    static const Rgb kColors[] = {
        {0.000, 0.447, 0.698},  // blue
        {0.835, 0.369, 0.000},  // vermillion
        {0.000, 0.620, 0.451},  // bluish green
        {0.800, 0.475, 0.655},  // reddish purple
        {0.902, 0.624, 0.000},  // orange
        {0.337, 0.706, 0.914},  // sky blue
        {0.941, 0.894, 0.259},  // yellow
    };
    return kColors[i % (sizeof kColors / sizeof kColors[0])];
}

}  // namespace kv::plot
