// The repeat task: samples are deterministic per (seed, index), hold two identical copies of a
// passage at the requested distance and total length, and refuse lengths that do not fit; the
// copy scorer counts exact copies, copied prefixes and matching tokens on hand-made answers.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/data/repeat_task.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

TEST(RepeatTask, DeterministicPerSeedAndIndex) {
    auto tok = make_byte_tokenizer();
    RepeatSpec spec;
    spec.seq_length = 600;
    spec.passage_length = 40;
    const RepeatSample a = make_repeat_sample(spec, 0, *tok), b = make_repeat_sample(spec, 0, *tok);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_NE(make_repeat_sample(spec, 1, *tok).ids, a.ids);
    spec.seed = 99;
    EXPECT_NE(make_repeat_sample(spec, 0, *tok).ids, a.ids);
}

TEST(RepeatTask, TwoEqualCopiesAtTheRequestedDistance) {
    auto tok = make_byte_tokenizer();
    const int64_t bos = int64_t(tok->encode("", true).size());
    for (int64_t distance : std::vector<int64_t>{-1, 0, 100, 600 - 2 * 40 - bos}) {
        RepeatSpec spec;
        spec.seq_length = 600;
        spec.passage_length = 40;
        spec.distance = distance;
        const RepeatSample s = make_repeat_sample(spec, 3, *tok);
        ASSERT_EQ(int64_t(s.ids.size()), 600) << "distance " << distance;
        const int64_t D = distance < 0 ? 600 - bos - 80 : distance;
        EXPECT_EQ(s.second_copy - (s.first_copy + 40), D);
        EXPECT_EQ(s.second_copy + 40, 600);  // the second copy ends the sample
        const std::vector<int32_t> first(s.ids.begin() + s.first_copy, s.ids.begin() + s.first_copy + 40);
        const std::vector<int32_t> second(s.ids.begin() + s.second_copy, s.ids.end());
        EXPECT_EQ(first, second);
        // the scored span: the second copy after the cue, as next-token targets
        EXPECT_EQ(s.first_scored_input() + 1, s.second_copy + kRepeatCue);
        EXPECT_EQ(s.first_scored_input() + s.scored_tokens(), 600 - 1);
    }
}

TEST(RepeatTask, LengthsThatDoNotFitAreRefused) {
    auto tok = make_byte_tokenizer();
    RepeatSpec spec;
    spec.seq_length = 100;
    spec.passage_length = 60;
    try {
        make_repeat_sample(spec, 0, *tok);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot hold two copies of 60 tokens"), std::string::npos) << e.what();
    }
    spec.passage_length = 20;
    spec.distance = 90;
    EXPECT_THROW(make_repeat_sample(spec, 0, *tok), Error);
    spec.distance = -1;
    spec.passage_length = kRepeatCue;
    EXPECT_THROW(make_repeat_sample(spec, 0, *tok), Error);
}

TEST(RepeatTask, CopyScoreOnHandMadeAnswers) {
    const std::vector<int32_t> want = {5, 6, 7, 8};
    CopyScore c = score_copy(want, {5, 6, 7, 8});
    EXPECT_TRUE(c.exact);
    EXPECT_EQ(c.prefix, 4);
    EXPECT_EQ(c.matches, 4);
    EXPECT_DOUBLE_EQ(c.token_accuracy(), 1.0);
    c = score_copy(want, {5, 6, 9, 8});  // one wrong in the middle
    EXPECT_FALSE(c.exact);
    EXPECT_EQ(c.prefix, 2);
    EXPECT_EQ(c.matches, 3);
    EXPECT_DOUBLE_EQ(c.token_accuracy(), 0.75);
    EXPECT_DOUBLE_EQ(c.prefix_fraction(), 0.5);
    c = score_copy(want, {9, 6, 7, 8});  // wrong first token: no prefix
    EXPECT_EQ(c.prefix, 0);
    EXPECT_EQ(c.matches, 3);
    c = score_copy(want, {5, 6});  // too short: the rest is wrong
    EXPECT_FALSE(c.exact);
    EXPECT_EQ(c.prefix, 2);
    EXPECT_EQ(c.matches, 2);
    c = score_copy({}, {});
    EXPECT_FALSE(c.exact);  // nothing to copy is not a copy
    EXPECT_EQ(c.length, 0);
}

}  // namespace
}  // namespace kv
