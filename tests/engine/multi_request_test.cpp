// Several questions per compressed context (SCBench's multi-request, --data.questions): the
// RULER generators ask each question about another key whose number the context really holds
// (read back from the decoded text); eval_long compresses each context exactly once and answers
// every question from that cache, each result bit-identical to compressing the same context
// again for that question alone; the configuration refuses the combinations it cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <regex>
#include <set>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/model_loader.h"
#include "engine/run/compress_then_ask.h"
#include "engine/run/evaluate.h"
#include "engine/run/protocol.h"
#include "engine/run/run_plan.h"

namespace kv {
namespace {

// The number the context states for `key` ("One of the special magic numbers for KEY is: N."),
// or "" when it states none or several.
std::string stated_number(const std::string& context, const std::string& key) {
    const std::regex re("special magic numbers for " + key + " is: ([0-9]+)\\.");
    std::string found;
    int n = 0;
    for (auto it = std::sregex_iterator(context.begin(), context.end(), re); it != std::sregex_iterator(); ++it) found = (*it)[1], ++n;
    return n == 1 ? found : std::string();
}

TEST(MultiRequest, NiahMultikeyAsksDistinctKeysTheContextAnswers) {
    auto tok = make_byte_tokenizer();
    RulerSpec spec;
    spec.task = "niah_multikey";
    spec.seq_length = 1600;
    spec.num_keys = 2;  // fewer keys than questions: the context holds one per question
    spec.questions = 3;
    for (int64_t index : {0, 1, 2}) {
        const RulerSample s = make_ruler_sample(spec, index, *tok);
        ASSERT_EQ(s.more_questions.size(), 2u);
        EXPECT_EQ(int64_t(s.ids.size()), 1600) << "the length counts the first question";
        const std::string context = tok->decode(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.question_start));
        // Every question: the key it names, the number its answer gives, and that number is the
        // one the context states for that key; no key asked twice.
        std::vector<std::pair<std::string, std::string>> qa = {
            {tok->decode(std::vector<int32_t>(s.ids.begin() + s.question_start, s.ids.begin() + s.answer_start)), s.answer}};
        for (const RulerQuestion& q : s.more_questions) {
            ASSERT_GT(q.answer_length, 0);
            const std::string text = tok->decode(q.ids);
            const std::string ans = tok->decode(std::vector<int32_t>(q.ids.end() - q.answer_length, q.ids.end()));
            EXPECT_EQ(ans, " " + q.answer);
            qa.push_back({text.substr(0, text.size() - ans.size()), q.answer});
        }
        std::set<std::string> keys;
        const std::regex asked("What is the special magic number for ([a-z]+) mentioned");
        for (const auto& [question, answer] : qa) {
            std::smatch m;
            ASSERT_TRUE(std::regex_search(question, m, asked)) << question;
            const std::string key = m[1];
            keys.insert(key);
            EXPECT_EQ(stated_number(context, key), answer) << "key " << key;
            EXPECT_NE(question.find("Answer: The special magic number for " + key), std::string::npos) << question;
        }
        EXPECT_EQ(keys.size(), 3u) << "three distinct keys asked";
    }
}

TEST(MultiRequest, NiahMultiqueryAsksUpToFourKeysPerQuestion) {
    auto tok = make_byte_tokenizer();
    RulerSpec spec;
    spec.task = "niah_multiquery";
    spec.seq_length = 2000;
    spec.num_keys = 6;
    spec.questions = 2;
    const RulerSample s = make_ruler_sample(spec, 4, *tok);
    ASSERT_EQ(s.more_questions.size(), 1u);
    const std::string context = tok->decode(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.question_start));
    const RulerQuestion& q = s.more_questions[0];
    const std::string text = tok->decode(std::vector<int32_t>(q.ids.begin(), q.ids.end() - q.answer_length));
    // "... numbers for a, b, c and d mentioned ...": the answer lists their numbers in that order.
    std::smatch m;
    ASSERT_TRUE(std::regex_search(text, m, std::regex("numbers for ([a-z, ]+) mentioned"))) << text;
    std::string list = std::regex_replace(std::string(m[1]), std::regex(" and "), ", ");
    std::string expect;
    size_t n = 0;
    for (size_t a = 0; a != std::string::npos; ++n) {
        const size_t b = list.find(", ", a);
        const std::string key = list.substr(a, b == std::string::npos ? b : b - a);
        expect += (n ? ", " : "") + stated_number(context, key);
        a = b == std::string::npos ? b : b + 2;
    }
    EXPECT_EQ(n, 4u);
    EXPECT_EQ(q.answer, expect);
}

TEST(MultiRequest, OneQuestionTasksRefuseSeveral) {
    auto tok = make_byte_tokenizer();
    RulerSpec spec;
    spec.task = "niah_single";
    spec.seq_length = 1000;
    spec.questions = 2;
    try {
        make_ruler_sample(spec, 0, *tok);
        FAIL() << "niah_single asked two questions";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--data.questions"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("niah_multikey"), std::string::npos) << e.what();
    }
    spec.questions = 1;
    EXPECT_TRUE(make_ruler_sample(spec, 0, *tok).more_questions.empty());
}

RunConfig multi_config(int64_t questions) {
    RunConfig cfg;
    cfg.mode = "eval_long";
    cfg.model = "tiny";
    cfg.data.name = "niah_multikey";
    cfg.data.seq_length = 700;
    cfg.data.num_samples = 2;
    cfg.data.questions = questions;
    cfg.driver.chunk_size = 64;
    cfg.kv_cache.name = "h2o-default";
    cfg.protocol.name = "compress-then-ask";
    cfg.protocol.compression_ratio = 0.5;
    return cfg;
}

// eval_long with 3 questions per context: one compression per context (counted), one result per
// question, and each result equals compressing that context afresh and asking that question
// alone: logits bit for bit, and the loss the run reported.
TEST(MultiRequest, EvalCompressesOnceAndEachQuestionAnswersAsIfAlone) {
    LoadedModel lm = load_model("tiny", ModelOptions{}, 0);
    const RunConfig cfg = multi_config(3);
    const EvalSummary sum = run_eval(cfg, lm);
    EXPECT_EQ(sum.contexts_compressed, 2) << "each context compressed exactly once";
    EXPECT_EQ(sum.questions_per_context, 3);
    ASSERT_EQ(sum.samples.size(), 6u);
    ASSERT_EQ(sum.question_accuracy.size(), 3u);

    RulerSpec spec;
    spec.task = cfg.data.name;
    spec.seq_length = cfg.data.seq_length;
    spec.seed = cfg.data.seed;
    spec.num_keys = cfg.data.ruler_keys;
    spec.questions = 3;
    const KVCacheConfig kc = run_cache_config(cfg, lm.config, lm.model->act_dtype());
    int64_t exact = 0;
    for (int64_t i = 0; i < 2; ++i) {
        const RulerSample s = make_ruler_sample(spec, i, *lm.tokenizer);
        const int64_t split = s.question_start;
        const std::vector<int32_t> context(s.ids.begin(), s.ids.begin() + split);
        std::vector<Question> qs(1);
        qs[0].ids.assign(s.ids.begin() + split, s.ids.end());
        for (const RulerQuestion& q : s.more_questions) qs.push_back({q.ids, {}});
        for (size_t j = 0; j < qs.size(); ++j) {
            // Targets from the hand count: the answer's tokens, each scored after the one before.
            const int64_t n = int64_t(qs[j].ids.size());
            const int64_t alen = j == 0 ? s.answer_length : s.more_questions[j - 1].answer_length;
            qs[j].targets.assign(size_t(n), -100);
            for (int64_t t = n - alen - 1; t < n - 1; ++t) qs[j].targets[size_t(t)] = qs[j].ids[size_t(t + 1)];
        }
        int64_t width = 0;
        for (const Question& q : qs) width = std::max(width, split + int64_t(q.ids.size()));
        const KVCacheConfig ctx_cache = context_cache_config(kc, split);
        const ChunkPlan plan = context_chunk_plan(cfg, ctx_cache, lm.config, split);
        const int64_t keep = compress_keep(cfg.protocol, split);
        EXPECT_EQ(keep, split / 2) << "floor(0.5 T)";
        CompressedCache shared = compress_context(*lm.model, ctx_cache, plan, context, keep, width);
        const std::vector<AskResult> together = ask_in_turn(*lm.model, shared, qs, true);
        for (size_t j = 0; j < qs.size(); ++j) {
            CompressedCache alone = compress_context(*lm.model, ctx_cache, plan, context, keep, width);
            const AskResult a = ask_compressed(*lm.model, alone, qs[j].ids, qs[j].targets, true);
            EXPECT_EQ(together[j].logits, a.logits) << "context " << i << " question " << j;
            EXPECT_EQ(together[j].argmax, a.argmax);
            const EvalSampleResult& r = sum.samples[size_t(i * 3 + int64_t(j))];
            EXPECT_EQ(r.context, i);
            EXPECT_EQ(r.question, int64_t(j));
            EXPECT_EQ(r.loss, a.loss_sum / double(a.count)) << "the run's result is the lone question's";
            exact += r.correct ? 1 : 0;
        }
    }
    EXPECT_DOUBLE_EQ(sum.accuracy, double(exact) / 6.0);
}

TEST(MultiRequest, ConfigurationRefusesWhatItCannotRun) {
    auto first = [](const RunConfig& c) {
        const auto p = run_config_problems(c);
        return p.empty() ? std::string() : p.front();
    };
    EXPECT_EQ(first(multi_config(3)), "");
    RunConfig c = multi_config(3);
    c.protocol = ProtocolConfig{};
    c.kv_cache.cache_length = 256;
    EXPECT_NE(first(c).find("--data.questions"), std::string::npos) << first(c);
    EXPECT_NE(first(c).find("compress-then-ask"), std::string::npos) << first(c);
    c = multi_config(2);
    c.data.name = "vt";
    EXPECT_NE(first(c).find("--data.questions"), std::string::npos) << first(c);
    c = multi_config(2);
    c.protocol.query_aware = true;
    EXPECT_NE(first(c).find("query_aware"), std::string::npos) << first(c);
    // Recorded with the run and read back.
    RunConfig d = multi_config(4);
    EXPECT_EQ(run_config_from_json(run_config_to_json(d), "test").data.questions, 4);
    EXPECT_THROW(set_run_option(d, "data.questions", "0"), Error);
}

}  // namespace
}  // namespace kv
