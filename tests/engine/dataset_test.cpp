// Datasets (engine/data/dataset): seeded train/val splits, target choices, similar-length
// batches with a resumable order.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>

#include "data_test_util.h"
#include "engine/core/error.h"
#include "engine/data/dataset.h"
#include "engine/data/helmet.h"
#include "engine/data/longbench_v2.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

using namespace data_test;

// ==== [SECTION] splits, target choices ====================================================================

TEST(DataSplit, SizesFollowTorchRandomSplit) {
    auto sizes = [](int64_t n, double f) {
        TrainValSplit s = split_train_val(n, f, 42);
        return std::make_pair(s.train.size(), s.val.size());
    };
    EXPECT_EQ(sizes(10, 0.1), std::make_pair(size_t(9), size_t(1)));
    EXPECT_EQ(sizes(7, 0.1), std::make_pair(size_t(7), size_t(0)));  // floor 6 / 0, remainder 1 to train
    EXPECT_EQ(sizes(5, 0.5), std::make_pair(size_t(3), size_t(2)));  // 2 / 2, remainder to train
    EXPECT_EQ(sizes(503, 0.1), std::make_pair(size_t(453), size_t(50)));
    EXPECT_EQ(sizes(0, 0.1), std::make_pair(size_t(0), size_t(0)));
    EXPECT_EQ(sizes(4, 0.0), std::make_pair(size_t(4), size_t(0)));
    EXPECT_NE(error_of([] {
                  split_train_val(10, 1.0, 1);
              }).find("--data.val_split_fraction: 1 is out of range; expected a fraction in [0, 1)"),
              std::string::npos);
    EXPECT_NE(error_of([] { split_train_val(10, -0.1, 1); }).find("out of range"), std::string::npos);
}

TEST(DataSplit, ReproducibleFromTheSeedDisjointAndComplete) {
    const int64_t n = 200;
    TrainValSplit a = split_train_val(n, 0.1, 42), b = split_train_val(n, 0.1, 42), c = split_train_val(n, 0.1, 43);
    EXPECT_EQ(a.train, b.train);
    EXPECT_EQ(a.val, b.val);
    EXPECT_NE(a.val, c.val);
    std::set<int64_t> all(a.train.begin(), a.train.end());
    for (int64_t v : a.val) EXPECT_TRUE(all.insert(v).second) << v << " is in both sets";
    EXPECT_EQ((int64_t)all.size(), n);
    EXPECT_EQ(*all.begin(), 0);
    EXPECT_EQ(*all.rbegin(), n - 1);
    // Not the identity: the split is random.
    std::vector<int64_t> sorted_train = a.train;
    std::sort(sorted_train.begin(), sorted_train.end());
    EXPECT_NE(sorted_train, a.train);
}

TEST(DataSplit, JsonRoundTripAndValidation) {
    TrainValSplit s = split_train_val(20, 0.25, 7);
    TrainValSplit r = split_from_json(json::parse(split_to_json(s).dump()), 20);
    EXPECT_EQ(r.train, s.train);
    EXPECT_EQ(r.val, s.val);
    EXPECT_NE(error_of([&] { split_from_json(split_to_json(s), 21); }).find("covers 20 records; the dataset has 21"),
              std::string::npos);
    json j = split_to_json(s);
    j["val_data_index"].push_back(j["train_data_index"][0]);
    EXPECT_NE(error_of([&] { split_from_json(j, 20); }).find("appears twice; expected disjoint sets"), std::string::npos);
    j = split_to_json(s);
    j["train_data_index"][0] = 99;
    EXPECT_NE(error_of([&] { split_from_json(j, 20); }).find("holds 99; expected indices in [0, 20)"), std::string::npos);
    EXPECT_NE(error_of([] {
                  split_from_json(json{{"train_data_index", {0}}}, 1);
              }).find("an index list is missing"),
              std::string::npos);
    EXPECT_NE(error_of([] {
                  split_from_json(json{{"train_data_index", "x"}, {"val_data_index", json::array()}}, 1);
              }).find("'train_data_index' is a string"),
              std::string::npos);
}

TEST(DataSplit, SelectRecordsFollowsTheIndices) {
    std::vector<DataRecord> recs(4);
    for (int i = 0; i < 4; ++i) recs[(size_t)i].id = str("r", i);
    EXPECT_EQ(ids_of(select_records(recs, {3, 0})), (std::vector<std::string>{"r3", "r0"}));
    EXPECT_NE(error_of([&] { select_records(recs, {4}); }).find("index 4 is outside [0, 4)"), std::string::npos);
}

TEST(DataTargets, ChoicesAreInRangeAndReproducible) {
    std::vector<DataRecord> recs(50);
    for (size_t i = 0; i < recs.size(); ++i) {
        recs[i].source_index = (int64_t)i;
        recs[i].targets.assign(1 + i % 4, "t");
    }
    recs[7].targets.clear();
    std::vector<int32_t> a = draw_target_choices(recs, 5), b = draw_target_choices(recs, 5), c = draw_target_choices(recs, 6);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    for (size_t i = 0; i < recs.size(); ++i) {
        if (recs[i].targets.empty()) {
            EXPECT_EQ(a[i], -1);
            continue;
        }
        EXPECT_GE(a[i], 0);
        EXPECT_LT(a[i], (int32_t)recs[i].targets.size());
    }
}

// ==== [SECTION] batches ===================================================================================

TEST(DataBatches, SimilarLengthBatchesAscendingWithTheShortRemainderLast) {
    const std::vector<int64_t> len = {50, 10, 40, 20, 30, 60, 70};
    auto b = similar_length_batches(len, 3);
    EXPECT_EQ(b, (std::vector<std::vector<int64_t>>{{1, 3, 4}, {2, 0, 5}, {6}}));
    // Ties keep index order.
    EXPECT_EQ(similar_length_batches({5, 5, 1, 5}, 2), (std::vector<std::vector<int64_t>>{{2, 0}, {1, 3}}));
    EXPECT_EQ(similar_length_batches({3, 1, 2}, 1), (std::vector<std::vector<int64_t>>{{1}, {2}, {0}}));
    EXPECT_TRUE(similar_length_batches({}, 2).empty());
    EXPECT_NE(error_of([] { similar_length_batches({1}, 0); }).find("--train.micro_batch_size: 0 is out of range"),
              std::string::npos);
}

std::vector<int64_t> random_lengths(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> v(n);
    for (auto& x : v) x = 1 + int64_t(rng() % 1000);
    return v;
}

TEST(DataBatches, EveryEpochHandsOutEveryBatchOnce) {
    const auto len = random_lengths(23, 1);
    BatchOrderOptions opt;
    opt.micro_batch_size = 4;
    opt.seed = 3;
    BatchIterator it(len, opt);
    ASSERT_EQ(it.num_batches(), 6);
    std::vector<std::vector<int64_t>> first_epoch;
    for (int epoch = 1; epoch <= 3; ++epoch) {
        std::multiset<int64_t> seen;
        std::vector<std::vector<int64_t>> order;
        for (int k = 0; k < 6; ++k) {
            const auto& b = it.next();
            EXPECT_EQ(it.epoch(), epoch);
            EXPECT_EQ(it.position(), k + 1);
            for (size_t j = 1; j < b.size(); ++j)
                EXPECT_LE(len[(size_t)b[j - 1]], len[(size_t)b[j]]) << "ascending within a batch";
            seen.insert(b.begin(), b.end());
            order.push_back(b);
        }
        EXPECT_EQ(seen.size(), 23u);
        EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 23u);
        if (epoch == 1)
            first_epoch = order;
        else
            EXPECT_NE(order, first_epoch) << "shuffled differently per epoch";
    }
}

TEST(DataBatches, OrderOptions) {
    const auto len = random_lengths(17, 2);
    const auto parts = similar_length_batches(len, 3);  // 6 batches, the last of 2 holds the longest
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;

    opt.shuffle = false;  // validation: ascending, remainder last, same every epoch
    BatchIterator plain(len, opt);
    for (int e = 0; e < 2; ++e)
        for (size_t k = 0; k < parts.size(); ++k) EXPECT_EQ(plain.next(), parts[k]);

    opt.shuffle = true;
    opt.longest_first = true;  // first epoch only
    BatchIterator longest(len, opt);
    EXPECT_EQ(longest.next(), parts.back());
    for (int k = 1; k < 6; ++k) longest.next();
    // From the second epoch on, the order is the plain shuffled one of that epoch.
    opt.longest_first = false;
    BatchIterator shuffled(len, opt);
    for (int k = 0; k < 6; ++k) shuffled.next();
    for (int k = 0; k < 6; ++k) EXPECT_EQ(longest.next(), shuffled.next());
    EXPECT_EQ(longest.permutation(), shuffled.permutation());

    opt.longest_first = false;
    opt.shortest_first = true;  // every epoch
    BatchIterator shortest(len, opt);
    for (int e = 0; e < 3; ++e) {
        EXPECT_EQ(shortest.next(), parts.front()) << "epoch " << e;
        for (int k = 1; k < 6; ++k) EXPECT_NE(shortest.next(), parts.front());
    }

    opt.longest_first = true;
    EXPECT_NE(error_of([&] {
                  BatchIterator both(len, opt);
              }).find("trainloader_longest_first and trainloader_shortest_first are both set"),
              std::string::npos);
    EXPECT_NE(error_of([] { BatchIterator none({}, BatchOrderOptions{}); }).find("no records to iterate over"),
              std::string::npos);
}

TEST(DataBatches, LongestFirstHoldsTheLongestRecords) {
    const auto len = random_lengths(10, 4);
    BatchOrderOptions opt;
    opt.micro_batch_size = 4;
    opt.longest_first = true;
    BatchIterator it(len, opt);
    const auto& first = it.next();  // 10 = 4 + 4 + 2: the remainder holds the two longest
    ASSERT_EQ(first.size(), 2u);
    std::vector<int64_t> sorted = len;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(len[(size_t)first[0]], sorted[8]);
    EXPECT_EQ(len[(size_t)first[1]], sorted[9]);
}

TEST(DataBatches, StateRoundTripResumesWithTheSameBatches) {
    const auto len = random_lengths(31, 5);
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;
    opt.seed = 11;
    opt.longest_first = true;
    for (int steps : {0, 1, 4, 11, 12, 13, 30}) {
        BatchIterator a(len, opt);
        for (int k = 0; k < steps; ++k) a.next();
        const std::string saved = a.state().dump();
        BatchIterator b(len, opt);
        b.restore(json::parse(saved));
        EXPECT_EQ(b.epoch(), a.epoch());
        EXPECT_EQ(b.position(), a.position());
        for (int k = 0; k < 40; ++k) ASSERT_EQ(b.next(), a.next()) << "steps " << steps << ", then " << k;
    }
}

TEST(DataBatches, RestoreRejectsStateOfOtherDataOrOptions) {
    const auto len = random_lengths(12, 6);
    BatchOrderOptions opt;
    opt.micro_batch_size = 3;
    BatchIterator a(len, opt);
    a.next();
    const json state = a.state();

    BatchIterator b(random_lengths(13, 6), opt);  // a different dataset: other batches
    std::string msg = error_of([&] { b.restore(state); });
    EXPECT_NE(msg.find("micro-batches differ"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resume with the same dataset"), std::string::npos) << msg;

    BatchOrderOptions opt2 = opt;
    opt2.micro_batch_size = 4;
    BatchIterator c(len, opt2);
    EXPECT_NE(error_of([&] { c.restore(state); }).find("saved with micro batch size 3, now 4"), std::string::npos);
    opt2 = opt;
    opt2.seed = 1;
    BatchIterator e(len, opt2);
    EXPECT_NE(error_of([&] { e.restore(state); }).find("saved with seed 42, now 1"), std::string::npos);

    BatchIterator f(len, opt);
    json bad = state;
    bad["permutation"] = json({0, 0, 1, 2});
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("do not fit 4 micro-batches"), std::string::npos);
    bad = state;
    bad.erase("position");
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("field 'position' is missing"), std::string::npos);
    bad = state;
    bad["epoch"] = "one";
    EXPECT_NE(error_of([&] { f.restore(bad); }).find("wrong type"), std::string::npos);
}

}  // namespace
}  // namespace kv
