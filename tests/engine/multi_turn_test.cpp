// SCBench's two shared-context modes over one compressed context (--data.turns): multi-turn, a
// conversation where each question comes after the earlier questions and the model's greedy
// answers, against multi-request, each question from the compressed context alone. With the
// dense cache a conversation is exactly a plain generation over the transcript built by hand; a
// decoding budget holds over the whole conversation; multi-request questions do not see each
// other; eval_long compresses each context once and records a score per turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/kv/compressed_cache.h"
#include "engine/model/model_loader.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"
#include "engine/run/protocol.h"
#include "engine/run/run_config.h"
#include "engine/run/run_plan.h"
#include "tests/engine/kv_test_util.h"
#include "tests/engine/tiny_model_util.h"

namespace kv::test {
namespace {

TinyModel& tiny() { return tiny_model<29>(); }

constexpr int64_t kSlack = 2;

// A question: `prompt` random ids, then `answer` random ids, each answer token scored after the
// token before it.
Question make_question(int64_t prompt, int64_t answer, uint64_t seed) {
    Question q;
    q.ids = random_tokens(prompt + answer, seed);
    q.targets.assign(q.ids.size(), -100);
    for (int64_t t = prompt - 1; t + 1 < int64_t(q.ids.size()); ++t) q.targets[size_t(t)] = q.ids[size_t(t + 1)];
    return q;
}

CompressedCache compressed(const std::string& cache, const std::vector<int32_t>& ctx, int64_t keep, int64_t width) {
    KVCacheConfig base;
    base.name = cache;
    apply_required_options(base);
    const int64_t T = int64_t(ctx.size());
    const KVCacheConfig kc = context_cache_config(base, T);
    RunConfig cfg;
    cfg.driver.chunk_size = 8;
    return compress_context(tiny().model, kc, context_chunk_plan(cfg, kc, tiny().cfg, T), ctx, keep, width, &byte_codec());
}

// (n, V) f32 logits of a plain single forward over `ids` (no cache at all).
std::vector<float> plain_logits(const std::vector<int32_t>& ids) {
    return tiny().model.forward(Tensor::from_i32({1, int64_t(ids.size())}, ids)).to_f32_vector();
}

int32_t argmax_row(const std::vector<float>& z, int64_t row, int64_t V) {
    const float* r = z.data() + row * V;
    return int32_t(std::max_element(r, r + V) - r);
}

TEST(MultiTurn, DenseConversationIsAPlainGenerationOverTheHandBuiltTranscript) {
    const std::vector<int32_t> ctx = random_tokens(56, 1);
    const std::vector<Question> qs = {make_question(6, 4, 2), make_question(5, 3, 3), make_question(7, 4, 4)};
    const int64_t width = questions_width(56, qs, QuestionTurns::MULTI_TURN, kSlack);
    CompressedCache cc = compressed("dense-default", ctx, 56, width);
    const std::vector<TurnAnswer> turns = ask_questions(tiny().model, cc, qs, QuestionTurns::MULTI_TURN, kSlack, {}, true);
    ASSERT_EQ(turns.size(), 3u);

    // The conversation by hand: context, then per turn the question's prompt and the greedy
    // answer, each next token the argmax of a plain forward over everything before it.
    tiny().model.set_context_width(cc.rope_width());
    const int64_t V = tiny().cfg.vocab_size;
    std::vector<int32_t> seq = ctx;
    for (size_t j = 0; j < qs.size(); ++j) {
        SCOPED_TRACE(j);
        const std::vector<int32_t> before(seq.begin() + 56, seq.end());
        EXPECT_EQ(turns[j].transcript, before) << "turn j sees the earlier prompts and greedy answers";
        // Teacher-forced: the question's logits after the transcript match the plain forward.
        std::vector<int32_t> forced = seq;
        forced.insert(forced.end(), qs[j].ids.begin(), qs[j].ids.end());
        const std::vector<float> want = plain_logits(forced);
        const int64_t off = int64_t(seq.size()) - 56;  // the transcript's length
        const std::vector<float>& got = turns[j].asked.logits;
        ASSERT_EQ(int64_t(got.size()), (off + int64_t(qs[j].ids.size())) * V);
        double err = 0, ref = 0;
        for (size_t k = 0; k < got.size(); ++k) {
            err = std::max(err, std::fabs(double(got[k]) - double(want[size_t(56 * V) + k])));
            ref = std::max(ref, std::fabs(double(want[size_t(56 * V) + k])));
        }
        EXPECT_LE(err, 1e-4 * ref) << "transcript + question logits";
        // Greedy answer.
        const int64_t expected = std::count_if(qs[j].targets.begin(), qs[j].targets.end(), [](int32_t y) { return y >= 0; });
        const int64_t first = int64_t(qs[j].ids.size()) - expected - 1;
        seq.insert(seq.end(), qs[j].ids.begin(), qs[j].ids.begin() + first + 1);
        std::vector<int32_t> answer;
        for (int64_t t = 0; t < expected + kSlack; ++t) {
            const std::vector<float> z = plain_logits(seq);
            answer.push_back(argmax_row(z, int64_t(seq.size()) - 1, V));
            seq.push_back(answer.back());
        }
        EXPECT_EQ(turns[j].answer, answer) << "no stop id: expected length + slack tokens";
    }
}

TEST(MultiTurn, MultiRequestQuestionsDoNotSeeEachOther) {
    const std::vector<int32_t> ctx = random_tokens(64, 5);
    const std::vector<Question> qs = {make_question(6, 4, 6), make_question(5, 3, 7)};
    const int64_t width = questions_width(64, qs, QuestionTurns::MULTI_TURN, kSlack);  // one width for all three caches
    CompressedCache both = compressed("snapkv-default", ctx, 32, width);
    const std::vector<TurnAnswer> req = ask_questions(tiny().model, both, qs, QuestionTurns::MULTI_REQUEST, kSlack, {}, true);
    CompressedCache alone = compressed("snapkv-default", ctx, 32, width);
    const std::vector<TurnAnswer> second = ask_questions(tiny().model, alone, {qs[1]}, QuestionTurns::MULTI_REQUEST, kSlack, {}, true);
    EXPECT_TRUE(req[1].transcript.empty());
    EXPECT_EQ(req[1].answer, second[0].answer) << "question 2's answer whether question 1 was asked or not";
    EXPECT_EQ(req[1].asked.logits, second[0].asked.logits) << "bit for bit";
    // In a conversation the same question comes after question 1 and its answer.
    CompressedCache conv = compressed("snapkv-default", ctx, 32, width);
    const std::vector<TurnAnswer> mt = ask_questions(tiny().model, conv, qs, QuestionTurns::MULTI_TURN, kSlack, {}, true);
    std::vector<int32_t> t1(qs[0].ids.begin(), qs[0].ids.begin() + 6);
    t1.insert(t1.end(), req[0].answer.begin(), req[0].answer.end());
    EXPECT_EQ(mt[0].answer, req[0].answer) << "turn 1 has no history either way";
    EXPECT_EQ(mt[1].transcript, t1);
    EXPECT_NE(mt[1].asked.logits.size(), req[1].asked.logits.size());
}

// A decoding budget holds over the whole conversation: after turn j's teacher-forced pass each
// layer keeps floor((1 - r) seen) slots, seen = context + transcript + question.
TEST(MultiTurn, DecodingBudgetActsOnTheEarlierTurns) {
    const std::vector<int32_t> ctx = random_tokens(48, 8);
    const std::vector<Question> qs = {make_question(5, 3, 9), make_question(4, 3, 10), make_question(6, 2, 11)};
    CompressedCache cc = compressed("snapkv-default", ctx, 24, questions_width(48, qs, QuestionTurns::MULTI_TURN, kSlack));
    cc.set_decode_ratio(0.5);
    const std::vector<TurnAnswer> turns = ask_questions(tiny().model, cc, qs, QuestionTurns::MULTI_TURN, kSlack, {});
    for (size_t j = 0; j < turns.size(); ++j) {
        const int64_t seen = 48 + int64_t(turns[j].transcript.size() + qs[j].ids.size());
        ASSERT_EQ(int64_t(turns[j].slots.size()), tiny().cfg.num_layers);
        for (int64_t k : turns[j].slots) EXPECT_EQ(k, seen / 2) << "turn " << j;
    }
    EXPECT_GT(turns[2].transcript.size(), 0u);
}

RunConfig conversation_config(const std::string& turns) {
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "niah_multikey";
    cfg.data.seq_length = 700;
    cfg.data.num_samples = 2;
    cfg.data.questions = 3;
    cfg.data.turns = turns;
    cfg.driver.chunk_size = 64;
    cfg.kv_cache.name = "h2o-default";
    cfg.protocol.name = "compress-then-ask";
    cfg.protocol.compression_ratio = 0.5;
    return cfg;
}

// eval_long multi-turn: each context compressed once, a result per turn equal to the library's
// conversation over a fresh compression, and per-turn means that average those results.
TEST(MultiTurn, EvalCompressesOnceAndScoresEachTurn) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    const RunConfig cfg = conversation_config("multi-turn");
    const EvalSummary sum = run_eval(cfg, lm);
    EXPECT_EQ(sum.contexts_compressed, 2) << "each context compressed exactly once";
    ASSERT_EQ(sum.samples.size(), 6u);
    ASSERT_EQ(sum.question_score.size(), 3u);
    ASSERT_EQ(sum.question_accuracy.size(), 3u);
    for (int64_t j = 0; j < 3; ++j) {
        const double acc = (double(sum.samples[size_t(j)].correct) + double(sum.samples[size_t(3 + j)].correct)) / 2.0;
        const double score = (sum.samples[size_t(j)].generated_score + sum.samples[size_t(3 + j)].generated_score) / 2.0;
        EXPECT_DOUBLE_EQ(sum.question_accuracy[size_t(j)], acc);
        EXPECT_DOUBLE_EQ(sum.question_score[size_t(j)], score);
        EXPECT_NE(sum.samples[size_t(j)].description.find("turn " + std::to_string(j + 1) + " of 3"), std::string::npos);
    }
    EXPECT_GT(sum.samples[2].tokens, sum.samples[0].tokens) << "turn 3 is fed after two turns of transcript";

    // The first context by hand: the same compression, the library's conversation.
    RulerSpec spec;
    spec.task = cfg.data.name;
    spec.seq_length = cfg.data.seq_length;
    spec.seed = cfg.data.seed;
    spec.num_keys = cfg.data.ruler_keys;
    spec.questions = 3;
    const RulerSample s = make_ruler_sample(spec, 0, *lm.tokenizer);
    const int64_t split = s.question_start;
    std::vector<Question> qs(1);
    qs[0].ids.assign(s.ids.begin() + split, s.ids.end());
    qs[0].targets.assign(qs[0].ids.size(), -100);
    for (int64_t t = int64_t(qs[0].ids.size()) - s.answer_length - 1; t + 1 < int64_t(qs[0].ids.size()); ++t)
        qs[0].targets[size_t(t)] = qs[0].ids[size_t(t + 1)];
    for (const RulerQuestion& q : s.more_questions) {
        Question x{q.ids, std::vector<int32_t>(q.ids.size(), -100)};
        for (int64_t t = int64_t(q.ids.size()) - q.answer_length - 1; t + 1 < int64_t(q.ids.size()); ++t) x.targets[size_t(t)] = q.ids[size_t(t + 1)];
        qs.push_back(x);
    }
    const KVCacheConfig kc = run_cache_config(cfg, lm.config, lm.model->act_dtype());
    const KVCacheConfig ctx_cache = context_cache_config(kc, split);
    const std::vector<int32_t> context(s.ids.begin(), s.ids.begin() + split);
    CompressedCache cc = compress_context(*lm.model, ctx_cache, context_chunk_plan(cfg, ctx_cache, lm.config, split), context, split / 2,
                                          questions_width(split, qs, QuestionTurns::MULTI_TURN, 8));
    const std::vector<TurnAnswer> turns = ask_questions(*lm.model, cc, qs, QuestionTurns::MULTI_TURN, 8, lm.tokenizer->eos_ids());
    for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(sum.samples[j].loss, turns[j].asked.loss_sum / double(turns[j].asked.count)) << "turn " << j;
        EXPECT_EQ(sum.samples[j].generated_tokens, int64_t(turns[j].answer.size()));
    }
}

// A chat frame: a conversation's later questions open user turns of their own (the assistant's
// turn closed, the user's opened, as a template frames a second message); multi-request
// questions stay inside the first user turn. A made-up frame on the byte tokenizer, so the
// tokens are the characters.
TEST(MultiTurn, ChatFrameOpensAUserTurnForEachLaterQuestion) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    const auto frame = [](const std::string& user) { return "[U]" + user + "[/U][A]"; };
    const auto turn_end = [] { return std::string("[/A]"); };
    RulerSpec spec;
    spec.task = "niah_multikey";
    spec.seq_length = 700;
    spec.questions = 3;
    spec.chat = frame;
    spec.chat_turn_end = turn_end;
    const RulerSample s = make_ruler_sample(spec, 0, *lm.tokenizer);
    ASSERT_EQ(s.more_questions.size(), 2u);
    for (const RulerQuestion& q : s.more_questions) {
        EXPECT_EQ(lm.tokenizer->decode(q.turn_open, true), "[/A][U]");
        // the question itself ends the user's turn and opens the assistant's with the answer's first words
        EXPECT_NE(lm.tokenizer->decode(q.ids, true).find("[/U][A]"), std::string::npos);
    }
    spec.chat_turn_end = nullptr;
    EXPECT_TRUE(make_ruler_sample(spec, 0, *lm.tokenizer).more_questions[0].turn_open.empty()) << "no turn end, no reopening";
    spec.chat = nullptr;
    EXPECT_TRUE(make_ruler_sample(spec, 0, *lm.tokenizer).more_questions[0].turn_open.empty()) << "the plain frame";

    // eval_long: a conversation's first turn is the same either way (the same greedy answer, so
    // the same transcript before turn 2); turn 2 is fed exactly the opening "[/A][U]" more.
    EvalCallbacks with, without;
    with.chat_frame = without.chat_frame = frame;
    with.chat_turn_end = turn_end;
    const EvalSummary a = run_eval(conversation_config("multi-turn"), lm, with), b = run_eval(conversation_config("multi-turn"), lm, without);
    ASSERT_EQ(a.samples.size(), 6u);
    ASSERT_EQ(b.samples.size(), 6u);
    for (size_t c : {0u, 3u}) {  // each context's turns 1 and 2
        EXPECT_EQ(a.samples[c].tokens, b.samples[c].tokens) << "context " << c / 3;
        EXPECT_EQ(a.samples[c].generated_tokens, b.samples[c].generated_tokens) << "context " << c / 3;
        EXPECT_EQ(a.samples[c + 1].tokens - b.samples[c + 1].tokens, 7) << "context " << c / 3 << ": turn 2 opens a user turn";
    }
    // multi-request: every question inside the first user turn, no opening
    const EvalSummary r = run_eval(conversation_config("multi-request"), lm, with), r0 = run_eval(conversation_config("multi-request"), lm, without);
    ASSERT_EQ(r.samples.size(), r0.samples.size());
    for (size_t j = 0; j < r.samples.size(); ++j) EXPECT_EQ(r.samples[j].tokens, r0.samples[j].tokens) << "multi-request question " << j;
}

TEST(MultiTurn, BadTurnsOptionIsOneClearMessage) {
    RunConfig c = conversation_config("multi-turn");
    EXPECT_TRUE(run_config_problems(c).empty());
    try {
        set_run_option(c, "data.turns", "conversation");
        FAIL() << "an unknown way of asking was accepted";
    } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("--data.turns"), std::string::npos) << m;
        EXPECT_NE(m.find("multi-request"), std::string::npos) << m;
        EXPECT_NE(m.find("multi-turn"), std::string::npos) << m;
    }
    c.protocol = ProtocolConfig{};  // chunked
    c.data.questions = 1;
    c.kv_cache.cache_length = 256;
    const auto p = run_config_problems(c);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_NE(p[0].find("--data.turns multi-turn"), std::string::npos) << p[0];
    EXPECT_NE(p[0].find("compress-then-ask"), std::string::npos) << p[0];
    // Recorded with the run and read back.
    EXPECT_EQ(run_config_from_json(run_config_to_json(conversation_config("multi-turn")), "test").data.turns, "multi-turn");
    EXPECT_EQ(run_config_from_json(run_config_to_json(RunConfig{}), "test").data.turns, "multi-request");
}

}  // namespace
}  // namespace kv::test
