// policy_similarity_columns (engine/kv/policies/policy_similarity_scan.h), rkv's redundancy pass:
// every ISA path this CPU runs against the plain per-column loop written out here, bit for bit,
// on shapes that hit the vector blocks, the column tails, the self rows and a strided matrix.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <vector>

#include "engine/kv/policies/policy_math.h"
#include "engine/kv/policies/policy_similarity_scan.h"

namespace kv::test {
namespace {

void check(int level, int64_t rows, int64_t n, int64_t c0, double threshold) {
    const int64_t ld = n + 3;
    std::mt19937 rng(uint32_t(rows * 131 + n * 7 + c0));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> S(static_cast<size_t>(rows * ld));
    for (float& x : S) x = u(rng);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (int64_t j = 0; j < rows; ++j) pos[size_t(j)] = int32_t(j);
    std::shuffle(pos.begin(), pos.end(), rng);  // slot order is not position order
    std::vector<double> sum(static_cast<size_t>(n)), newest(static_cast<size_t>(n)), exempt(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) sum[size_t(c)] = 0.25 * double(c), newest[size_t(c)] = -1.0, exempt[size_t(c)] = 0.0;
    std::vector<double> rsum = sum, rnew = newest, rex = exempt;
    // reference: rkv's definition, one column at a time, rows in order, its own slot skipped
    for (int64_t c = 0; c < n; ++c)
        for (int64_t j = 0; j < rows; ++j) {
            const bool self = j == c0 + c;
            const double v = self ? 0.0 : double(S[size_t(j * ld + c)]);
            rsum[size_t(c)] += v;
            if (!self && v > threshold && double(pos[size_t(j)]) > rnew[size_t(c)]) rnew[size_t(c)] = pos[size_t(j)], rex[size_t(c)] = v;
        }
    policy_similarity_columns_at(level, S.data(), ld, rows, n, c0, pos.data(), threshold, sum.data(), newest.data(), exempt.data());
    for (int64_t c = 0; c < n; ++c) {
        ASSERT_EQ(sum[size_t(c)], rsum[size_t(c)]) << "level " << level << " column " << c;
        ASSERT_EQ(newest[size_t(c)], rnew[size_t(c)]) << "level " << level << " column " << c;
        ASSERT_EQ(exempt[size_t(c)], rex[size_t(c)]) << "level " << level << " column " << c;
    }
}

TEST(PolicySimilarityScan, EveryLevelGivesThePlainLoopsBits) {
    for (int level = 2; level <= 4; ++level)
        for (const auto& [rows, n, c0] : std::vector<std::array<int64_t, 3>>{{1, 1, 0}, {40, 32, 0}, {100, 32, 40}, {100, 37, 60},
                                                                             {70, 5, 3}, {64, 64, 0}, {33, 50, -10}, {20, 16, 90}})
            for (double th : {0.5, -1.0, 0.0}) check(level, rows, n, c0, th);
}

TEST(PolicySimilarityScan, OwnSlotIsNeverItsNewestSimilarKey) {
    // every similarity 1 and the threshold -1: each column's own row adds 0 and is not exempt
    const int64_t rows = 40, n = 40;
    std::vector<float> S(size_t(rows * n), 1.0f);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (int64_t j = 0; j < rows; ++j) pos[size_t(j)] = int32_t(j);
    for (int level = 2; level <= 4; ++level) {
        std::vector<double> sum(size_t(n), 0.0), newest(size_t(n), -1.0), exempt(size_t(n), 0.0);
        policy_similarity_columns_at(level, S.data(), n, rows, n, 0, pos.data(), -1.0, sum.data(), newest.data(), exempt.data());
        for (int64_t c = 0; c < n; ++c) {
            EXPECT_EQ(sum[size_t(c)], double(rows - 1));
            EXPECT_EQ(newest[size_t(c)], c == rows - 1 ? double(rows - 2) : double(rows - 1));
            EXPECT_EQ(exempt[size_t(c)], 1.0);
        }
    }
}

}  // namespace
}  // namespace kv::test
