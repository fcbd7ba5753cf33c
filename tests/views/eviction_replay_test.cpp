// The one slot-plan replay (engine/telemetry/replay_plan.h, replay_plan_row) and what the
// eviction map counts through it: on random plans (grace-ring moves, rows that split from one
// shared table), the map's slot tables, copies per token and eviction steps equal a brute-force
// recount written here from the definition (a token is evicted at the first step after which no
// slot holds it), and its tables equal the engine's replay (replay_positions).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/kv/replay_log.h"
#include "views/eviction_map.h"

namespace kv::views {
namespace {

// A random plan of n new tokens at input_pos over L slots: per row, distinct targets and
// `moves` grace-ring moves (distinct destinations; sources anywhere, possibly empty slots).
SlotPlan random_plan(std::mt19937_64& rng, int64_t input_pos, int64_t n, int64_t rows, int64_t moves, int64_t L) {
    SlotPlan p;
    p.input_pos = input_pos, p.n = n, p.rows = rows, p.moves = moves;
    std::vector<int32_t> slots(static_cast<size_t>(L));
    for (int64_t r = 0; r < rows; ++r) {
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng);
        p.targets.insert(p.targets.end(), slots.begin(), slots.begin() + n);
        std::shuffle(slots.begin(), slots.end(), rng);
        p.move_to.insert(p.move_to.end(), slots.begin(), slots.begin() + moves);
        for (int64_t m = 0; m < moves; ++m) p.move_from.push_back(int32_t(rng() % uint64_t(L)));
    }
    p.length_after = L;
    return p;
}

storage::CacheStepRow step_row(const SlotPlan& p, int step, int64_t L) {
    storage::CacheStepRow row;
    row.id = step + 1, row.layer = 0, row.chunk = step, row.pass = 0;
    row.input_pos = p.input_pos, row.num_tokens = int32_t(p.n), row.cache_length = int32_t(L);
    row.replay_log = encode_plan(p);
    return row;
}

TEST(EvictionReplay, CountsEqualABruteForceRecountOnRandomPlans) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        std::mt19937_64 rng(seed);
        const int64_t L = 12 + int64_t(rng() % 8), R = 3, steps = 14;
        std::vector<SlotPlan> plans;
        int64_t pos = 0;
        for (int s = 0; s < steps; ++s) {
            const int64_t n = s == 0 ? L / 2 : 1 + int64_t(rng() % 5);
            const int64_t moves = s < 2 ? 0 : std::min<int64_t>(n, int64_t(rng() % 4));  // the format has moves <= n
            const int64_t rows = s < 4 ? 1 : R;  // shared slots first, then one table per row
            plans.push_back(random_plan(rng, pos, n, rows, moves, L));
            pos += n;
        }
        EvictionData data;
        for (int s = 0; s < steps; ++s)
            ASSERT_TRUE(data.ingest(step_row(plans[size_t(s)], s, L)))
                << "seed " << seed << " step " << s << ": "
                << (data.sequences.empty() || data.sequences[0].layers.empty() ? "" : data.sequences[0].layers[0].error);
        ASSERT_EQ(data.sequences.size(), 1u);
        const EvictionLayer& ly = data.sequences[0].layers.at(0);
        ASSERT_EQ(ly.rows, R);
        ASSERT_EQ(int64_t(ly.tracks.size()), R);
        int64_t engine_rows = 0;
        const std::vector<int32_t> engine = replay_positions(plans, plans.size(), L, &engine_rows);
        ASSERT_EQ(engine_rows, R);
        for (int64_t r = 0; r < R; ++r) {
            // Brute force: the whole table after each step, moves reading the table before it.
            std::vector<int32_t> table(static_cast<size_t>(L), -1);
            std::vector<int32_t> evicted(size_t(pos), kStillCached);
            for (int s = 0; s < steps; ++s) {
                const SlotPlan& p = plans[size_t(s)];
                const int64_t pr = p.rows == 1 ? 0 : r;
                const std::vector<int32_t> before = table;
                for (int64_t m = 0; m < p.moves; ++m)
                    table[size_t(p.move_to[size_t(pr * p.moves + m)])] = before[size_t(p.move_from[size_t(pr * p.moves + m)])];
                for (int64_t t = 0; t < p.n; ++t) table[size_t(p.targets[size_t(pr * p.n + t)])] = int32_t(p.input_pos + t);
                for (int64_t tok = 0; tok < p.input_pos + p.n; ++tok)
                    if (evicted[size_t(tok)] == kStillCached && std::count(table.begin(), table.end(), int32_t(tok)) == 0)
                        evicted[size_t(tok)] = s;
            }
            const EvictionTrack& tr = ly.tracks[size_t(r)];
            ASSERT_EQ(tr.slot_pos, table) << "seed " << seed << " row " << r;
            EXPECT_TRUE(std::equal(table.begin(), table.end(), engine.begin() + r * L)) << "seed " << seed << " row " << r;
            ASSERT_EQ(tr.evicted_at, evicted) << "seed " << seed << " row " << r;
            for (int64_t tok = 0; tok < pos; ++tok)
                ASSERT_EQ(int64_t(tr.copies[size_t(tok)]), int64_t(std::count(table.begin(), table.end(), int32_t(tok))))
                    << "seed " << seed << " row " << r << " token " << tok;
        }
        // Some token was evicted and some moved into a second slot, or the case proved nothing.
        int64_t gone = 0, doubled = 0;
        for (const EvictionTrack& tr : ly.tracks) {
            gone += std::count_if(tr.evicted_at.begin(), tr.evicted_at.end(), [](int32_t e) { return e != kStillCached; });
            doubled += std::count_if(tr.copies.begin(), tr.copies.end(), [](uint16_t c) { return c > 1; });
        }
        EXPECT_GT(gone, 0) << "seed " << seed;
        EXPECT_GT(doubled, 0) << "seed " << seed;
    }
}

TEST(EvictionReplay, EveryWriteIsReportedInOrderWithTheValueItReplaced) {
    std::mt19937_64 rng(3);
    const int64_t L = 10;
    std::vector<int32_t> table(static_cast<size_t>(L));
    for (int64_t i = 0; i < L; ++i) table[size_t(i)] = int32_t(100 + i);  // tokens 100.. held before the step
    const SlotPlan p = random_plan(rng, 200, 4, 1, 3, L);
    std::vector<int32_t> shadow = table;  // writes replayed one by one from the reports
    std::vector<SlotWrite> writes;
    replay_plan_row(p, 0, table.data(), L, [&](const SlotWrite& w) {
        EXPECT_EQ(shadow[size_t(w.slot)], w.old_pos) << "the value the slot held just before this write";
        shadow[size_t(w.slot)] = w.new_pos;
        writes.push_back(w);
    });
    ASSERT_EQ(int64_t(writes.size()), p.moves + p.n);
    for (int64_t m = 0; m < p.moves; ++m) {
        EXPECT_TRUE(writes[size_t(m)].moved);
        EXPECT_EQ(writes[size_t(m)].slot, p.move_to[size_t(m)]);
        EXPECT_EQ(writes[size_t(m)].new_pos, 100 + p.move_from[size_t(m)]) << "moves read the table before the step";
    }
    for (int64_t t = 0; t < p.n; ++t) {
        const SlotWrite& w = writes[size_t(p.moves + t)];
        EXPECT_FALSE(w.moved);
        EXPECT_EQ(w.slot, p.targets[size_t(t)]);
        EXPECT_EQ(w.new_pos, 200 + t);
    }
    EXPECT_EQ(shadow, table);
    // Slots outside the table are neither written nor reported.
    SlotPlan bad = p;
    bad.targets[0] = int32_t(L + 5);
    int reported = 0;
    replay_plan_row(bad, 0, table.data(), L, [&](const SlotWrite&) { ++reported; });
    EXPECT_EQ(reported, int(p.moves + p.n - 1));
}

}  // namespace
}  // namespace kv::views
