// The needle-in-a-haystack grid of a session: runs that set their needles' depths
// (--data.depths; sample i at depth i mod their count) and record each sample's answer
// (metric sample_correct), as cells (depth, sequence length) holding the share of needles found,
// one panel per group of runs. `kvlab plot --heatmap needle` draws it with cairo, the sweep view
// with ImGui; both read it here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "storage/run_info.h"

namespace kv::storage {

class SessionReader;

struct NeedleGridPanel {
    std::string title;                        // the panel's group (e.g. the cache name)
    std::vector<std::vector<double>> values;  // [depth][length]: mean of sample_correct; NaN: no sample
    std::vector<std::vector<int>> samples;    // [depth][length]: samples behind each value
};

struct NeedleGrid {
    std::vector<double> depths;    // ascending (rows, top to bottom)
    std::vector<int64_t> lengths;  // ascending data.seq_length (columns)
    std::vector<NeedleGridPanel> panels;  // in the order their first run appears
};

// The grid over the done runs of `reader` that set data.depths and that `include` accepts (null:
// all), grouped into panels by `panel_of` (null: one panel titled ""). Empty panels when no run
// qualifies.
NeedleGrid needle_grid(SessionReader& reader, const std::function<bool(const RunInfo&)>& include = {},
                       const std::function<std::string(const RunInfo&)>& panel_of = {});

}  // namespace kv::storage
