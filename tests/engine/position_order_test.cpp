// slots_by_position against its definition: the slots by ascending position (std::stable_sort of
// the slot indices by position), the empty (negative) ones first as a set.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "engine/kv/policies/position_order.h"

namespace kv::test {
namespace {

void expect_position_order(const std::vector<int32_t>& pos) {
    const int64_t T = int64_t(pos.size());
    std::vector<int32_t> want((size_t)T);
    std::iota(want.begin(), want.end(), 0);
    std::stable_sort(want.begin(), want.end(), [&](int32_t a, int32_t b) { return pos[size_t(a)] < pos[size_t(b)]; });
    std::vector<int32_t> got, table;
    slots_by_position(pos.data(), T, got, table);
    ASSERT_EQ(got.size(), want.size());
    const int64_t empty = std::count_if(pos.begin(), pos.end(), [](int32_t p) { return p < 0; });
    // the empty slots: the same set (their order is not part of the contract)
    EXPECT_EQ(std::set<int32_t>(got.begin(), got.begin() + empty), std::set<int32_t>(want.begin(), want.begin() + empty));
    for (int64_t i = empty; i < T; ++i) EXPECT_EQ(pos[size_t(got[size_t(i)])], pos[size_t(want[size_t(i)])]) << "at " << i;
    // distinct positions: exactly the one order
    std::vector<int32_t> held;
    for (int32_t p : pos)
        if (p >= 0) held.push_back(p);
    std::sort(held.begin(), held.end());
    if (std::adjacent_find(held.begin(), held.end()) == held.end()) {
        for (int64_t i = empty; i < T; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "at " << i;
    }
}

TEST(PositionOrder, EqualsSortingTheSlotsByPosition) {
    std::mt19937 rng(7);
    for (int trial = 0; trial < 50; ++trial) {
        const int64_t T = 1 + int64_t(rng() % 300);
        std::vector<int32_t> p((size_t)T);
        std::vector<int32_t> all((size_t)(3 * T));
        std::iota(all.begin(), all.end(), int32_t(rng() % 5000));
        std::shuffle(all.begin(), all.end(), rng);
        for (int64_t i = 0; i < T; ++i) p[size_t(i)] = rng() % 4 == 0 ? -1 : all[size_t(i)];  // a per-head pool's other slots
        expect_position_order(p);
    }
}

TEST(PositionOrder, RepeatedOrFarApartPositionsStillSort) {
    expect_position_order({5, 3, 5, -1, 0, 3, 9});                    // repeated: the std::sort path
    expect_position_order({2000000000, 1, -1, 7, 1000000});           // a span far beyond T
    expect_position_order({-1, -1, -1});                              // nothing held
    expect_position_order({});
    expect_position_order({0});
}

}  // namespace
}  // namespace kv::test
