// Cell bands that overlap (forward CELL spans and backward cells) go to different rows of the
// strip so no band covers another's label: bands of one row are disjoint, and the rows used
// equal the deepest overlap (computed here by brute force over every instant a band starts).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "views/memory_timeline.h"

namespace kv::views {
namespace {

TEST(CellBandSlots, RowsAreDisjointAndAsFewAsTheDeepestOverlap) {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 50; ++trial) {
        std::vector<CellBand> cells;
        std::uniform_int_distribution<int64_t> start(0, 1000), len(1, 300);
        for (int i = 0, n = 1 + trial % 12; i < n; ++i) {
            CellBand c;
            c.start_ns = start(rng);
            c.end_ns = c.start_ns + len(rng);
            cells.push_back(c);
        }
        std::stable_sort(cells.begin(), cells.end(), [](const CellBand& a, const CellBand& b) { return a.start_ns < b.start_ns; });
        const int rows = assign_cell_slots(cells);
        int depth = 0;
        for (const auto& at : cells) {
            int d = 0;
            for (const auto& c : cells) d += c.start_ns <= at.start_ns && at.start_ns < c.end_ns;
            depth = std::max(depth, d);
        }
        EXPECT_EQ(rows, depth);
        for (size_t i = 0; i < cells.size(); ++i)
            for (size_t j = i + 1; j < cells.size(); ++j)
                if (cells[i].slot == cells[j].slot) {
                    EXPECT_TRUE(cells[i].end_ns <= cells[j].start_ns || cells[j].end_ns <= cells[i].start_ns)
                        << "bands " << i << " and " << j << " share row " << cells[i].slot;
                }
    }
    // The case of the report: a forward cell 0,6 overlapping backward cells 0,0 .. 0,6.
    std::vector<CellBand> cells = {{0, 6, 0, 100, -1, 0}, {0, 0, 10, 40, -1, 0}, {0, 6, 40, 90, -1, 0}};
    EXPECT_EQ(assign_cell_slots(cells), 2);
    EXPECT_EQ(cells[0].slot, 0);
    EXPECT_EQ(cells[1].slot, 1);
    EXPECT_EQ(cells[2].slot, 1);
}

}  // namespace
}  // namespace kv::views
