// The replay log's one codec (engine/telemetry/replay_plan.h): range plans of any length,
// explicit plans with moves, damaged blobs refused with a reason, and one-row replay.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "engine/core/error.h"
#include "engine/telemetry/replay_plan.h"

namespace kv {
namespace {

TEST(ReplayPlan, RangePlansOfAnyLengthRoundTrip) {
    // A prefill of n tokens into slots [start, start + n): stored as its start, so the blob is
    // 56 bytes whatever n is (a size check against n once rejected every n > 56).
    for (int64_t n : {1, 56, 57, 1024, 100000}) {
        SlotPlan p;
        p.input_pos = 7, p.n = n, p.length_after = 3 + n;
        p.targets.resize(size_t(n));
        std::iota(p.targets.begin(), p.targets.end(), 3);
        const std::vector<uint8_t> blob = encode_plan(p);
        EXPECT_EQ(blob.size(), 56u) << n;
        const SlotPlan q = decode_plan(blob.data(), blob.size());
        EXPECT_EQ(q.n, n);
        EXPECT_EQ(q.input_pos, 7);
        EXPECT_EQ(q.length_after, 3 + n);
        ASSERT_EQ(q.targets.size(), size_t(n));
        for (int64_t t = 0; t < n; ++t) ASSERT_EQ(q.targets[size_t(t)], 3 + t) << n;
    }
}

TEST(ReplayPlan, ExplicitPlansWithMovesRoundTrip) {
    SlotPlan p;
    p.input_pos = 100, p.n = 3, p.rows = 2, p.moves = 1, p.length_after = 8;
    p.targets = {5, 1, 2, 0, 7, 6};
    p.move_from = {5, 0};
    p.move_to = {4, 3};
    const std::vector<uint8_t> blob = encode_plan(p);
    EXPECT_EQ(blob.size(), 48u + 4u * 2u * (3u + 2u));
    const SlotPlan q = decode_plan(blob.data(), blob.size());
    EXPECT_EQ(q.rows, 2);
    EXPECT_EQ(q.moves, 1);
    EXPECT_EQ(q.targets, p.targets);
    EXPECT_EQ(q.move_from, p.move_from);
    EXPECT_EQ(q.move_to, p.move_to);
}

TEST(ReplayPlan, DamagedBlobsAreRefusedWithTheReason) {
    SlotPlan p;
    p.n = 2, p.targets = {3, 1}, p.length_after = 2;
    std::vector<uint8_t> blob = encode_plan(p);
    auto reason = [](const std::vector<uint8_t>& b) {
        try {
            decode_plan(b.data(), b.size());
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("accepted");
    };
    std::vector<uint8_t> cut(blob.begin(), blob.end() - 1);
    EXPECT_NE(reason(cut).find("truncated"), std::string::npos) << reason(cut);
    std::vector<uint8_t> magic = blob;
    magic[0] ^= 0xff;
    EXPECT_NE(reason(magic).find("magic"), std::string::npos) << reason(magic);
    EXPECT_NE(reason({1, 2, 3}).find("truncated"), std::string::npos);
    // A range flag on a multi-row plan is not something the encoder writes.
    SlotPlan r;
    r.n = 4, r.targets = {0, 1, 2, 3};
    std::vector<uint8_t> range = encode_plan(r);
    const int64_t two = 2;
    std::memcpy(range.data() + 8 + 16, &two, 8);  // rows
    EXPECT_NE(reason(range).find("inconsistent"), std::string::npos) << reason(range);
}

TEST(ReplayPlan, ApplyMovesReadTheOldTableFirst) {
    // Slots hold positions 0..3; the move 0 -> 2 copies position 0 before slot 0 is overwritten
    // by the new token 10, and slot 2's old content (2) is gone.
    std::vector<int32_t> slots = {0, 1, 2, 3};
    SlotPlan p;
    p.input_pos = 10, p.n = 1, p.moves = 1, p.targets = {0}, p.move_from = {0}, p.move_to = {2};
    apply_plan_to_row(p, 0, slots.data(), int64_t(slots.size()));
    EXPECT_EQ(slots, (std::vector<int32_t>{10, 1, 0, 3}));
    // Out-of-table slots are ignored rather than written.
    SlotPlan bad;
    bad.input_pos = 20, bad.n = 1, bad.targets = {9};
    apply_plan_to_row(bad, 0, slots.data(), int64_t(slots.size()));
    EXPECT_EQ(slots, (std::vector<int32_t>{10, 1, 0, 3}));
}

}  // namespace
}  // namespace kv
