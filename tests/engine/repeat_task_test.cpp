// The repeat task: samples are deterministic per (seed, index), hold two identical copies of a
// passage at the requested distance and total length, and refuse lengths that do not fit; the
// copy scorer counts exact copies, copied prefixes and matching tokens on hand-made answers.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/core/error.h"
#include "engine/data/repeat_task.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/model_loader.h"
#include "engine/run/evaluate.h"

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

// The evaluation scores exactly the second copy after its cue: with the dense cache, each
// sample's loss and copied-token fraction equal an f64 cross-entropy and argmax over the logits
// of one plain (unchunked) forward at those positions.
TEST(RepeatTask, EvalScoresTheSecondCopyLikeAPlainForward) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "repeat";
    cfg.data.seq_length = 256;
    cfg.data.num_samples = 2;
    cfg.data.repeat_length = 24;
    cfg.data.repeat_distance = 100;
    cfg.driver.chunk_size = 32;
    const EvalSummary sum = run_eval(cfg, lm);
    ASSERT_EQ(sum.samples.size(), 2u);
    EXPECT_LT(sum.perplexity, 0);  // not a perplexity task
    double mean_copy = 0;
    for (int64_t i = 0; i < 2; ++i) {
        RepeatSpec spec;
        spec.seq_length = 256;
        spec.passage_length = 24;
        spec.distance = 100;
        spec.seed = cfg.data.seed;
        const RepeatSample rs = make_repeat_sample(spec, i, *lm.tokenizer);
        const int64_t T = int64_t(rs.ids.size());
        Tensor ids = Tensor::from_i32({1, T}, rs.ids, {Device{}, MemCategory::ACTIVATIONS, "ids"});
        const std::vector<float> z = lm.model->forward(ids).to_f32_vector();
        const int64_t V = int64_t(z.size()) / T;
        double loss = 0;
        int64_t right = 0;
        for (int64_t t = rs.first_scored_input(); t < rs.first_scored_input() + rs.scored_tokens(); ++t) {
            const float* row = z.data() + t * V;
            double mx = row[0];
            int64_t arg = 0;
            for (int64_t v = 1; v < V; ++v)
                if (row[v] > mx) mx = row[v], arg = v;
            double se = 0;
            for (int64_t v = 0; v < V; ++v) se += std::exp(double(row[v]) - mx);
            const int32_t target = rs.ids[size_t(t + 1)];
            loss += mx + std::log(se) - double(row[target]);
            right += arg == target;
        }
        loss /= double(rs.scored_tokens());
        EXPECT_NEAR(sum.samples[size_t(i)].loss, loss, 1e-4 * std::max(1.0, loss)) << "sample " << i;
        // argmax ties between the chunked and the plain forward could flip one token at most
        EXPECT_NEAR(sum.samples[size_t(i)].copy_token_accuracy, double(right) / double(rs.scored_tokens()),
                    1.01 / double(rs.scored_tokens()))
            << "sample " << i;
        mean_copy += sum.samples[size_t(i)].copy_token_accuracy / 2;
    }
    EXPECT_NEAR(sum.copy_token_accuracy, mean_copy, 1e-12);
}

}  // namespace
}  // namespace kv
