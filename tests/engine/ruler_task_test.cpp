// RULER-style tasks: samples are deterministic per (seed, index), exactly seq_length tokens, end
// with the answer's tokens, and the context really holds what the answer claims (read back from
// the decoded text, not from the generator's bookkeeping); the exact-match scorer is checked on
// hand-made answers; lengths that cannot fit are refused naming the option.
#include <gtest/gtest.h>

#include <map>
#include <regex>

#include "engine/core/error.h"
#include "engine/data/repeat_task.h"
#include "engine/data/ruler.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

std::vector<std::string> split(const std::string& s, const std::string& sep) {
    std::vector<std::string> out;
    size_t p = 0;
    while (true) {
        const size_t q = s.find(sep, p);
        out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) return out;
        p = q + sep.size();
    }
}

TEST(RulerTask, DeterministicPerSeedAndIndexAndExactLength) {
    auto tok = make_byte_tokenizer();
    for (const std::string& task : ruler_task_names()) {
        SCOPED_TRACE(task);
        RulerSpec spec;
        spec.task = task;
        spec.seq_length = 1500;
        const RulerSample a = make_ruler_sample(spec, 0, *tok), b = make_ruler_sample(spec, 0, *tok);
        EXPECT_EQ(a.ids, b.ids);
        EXPECT_EQ(int64_t(a.ids.size()), 1500);
        EXPECT_NE(make_ruler_sample(spec, 1, *tok).ids, a.ids);
        spec.seed = 77;
        EXPECT_NE(make_ruler_sample(spec, 0, *tok).ids, a.ids);
        // The sample ends with the answer.
        ASSERT_EQ(a.answer_start + a.answer_length, int64_t(a.ids.size()));
        const std::vector<int32_t> tail(a.ids.begin() + a.answer_start, a.ids.end());
        EXPECT_EQ(tok->decode(tail), " " + a.answer);  // the byte tokenizer has no chat template
        // Without a chat template the question ends with "Answer:" and the answer's first words.
        const std::string prompt = tok->decode(std::vector<int32_t>(a.ids.begin(), a.ids.begin() + a.answer_start));
        EXPECT_NE(prompt.rfind("Answer: "), std::string::npos);
        EXPECT_GT(prompt.rfind("Answer: "), prompt.size() - 160) << prompt.substr(prompt.size() - 200);
    }
}

TEST(RulerTask, EveryTaskFitsExactlyAtManyLengths) {
    // cwe's answer is known only after its list is drawn: its room must still come out exact.
    auto tok = make_byte_tokenizer();
    for (const std::string& task : ruler_task_names())
        for (int64_t T : {1024, 1025, 2048, 4096})
            for (int64_t keys : {2, 4, 10}) {
                RulerSpec spec;
                spec.task = task;
                spec.seq_length = T;
                spec.num_keys = keys;
                RulerSample s;
                ASSERT_NO_THROW(s = make_ruler_sample(spec, 2, *tok)) << task << " T=" << T << " keys=" << keys;
                EXPECT_EQ(int64_t(s.ids.size()), T) << task << " keys=" << keys;
                EXPECT_EQ(s.answer_start + s.answer_length, T) << task;
            }
}

TEST(RulerTask, TheContextHoldsTheAnswer) {
    auto tok = make_byte_tokenizer();
    for (uint64_t seed : {1u, 2u, 3u}) {
        RulerSpec spec;
        spec.seq_length = 2000;
        spec.seed = seed;
        spec.num_keys = 4;
        auto prompt_of = [&](const RulerSample& s) {
            return tok->decode(std::vector<int32_t>(s.ids.begin(), s.ids.begin() + s.answer_start));
        };
        {
            spec.task = "niah_single";
            const RulerSample s = make_ruler_sample(spec, 0, *tok);
            const std::string p = prompt_of(s);
            std::smatch m;
            ASSERT_TRUE(std::regex_search(p, m, std::regex("special magic number for (\\w+) mentioned"))) << p.substr(p.size() - 200);
            EXPECT_NE(p.find("magic numbers for " + m[1].str() + " is: " + s.answer + "."), std::string::npos);
        }
        {
            spec.task = "niah_multikey";
            const RulerSample s = make_ruler_sample(spec, 0, *tok);
            const std::string p = prompt_of(s);
            std::smatch m;
            ASSERT_TRUE(std::regex_search(p, m, std::regex("special magic number for (\\w+) mentioned")));
            EXPECT_NE(p.find("magic numbers for " + m[1].str() + " is: " + s.answer + "."), std::string::npos);
            const auto needles = split(p, "One of the special magic numbers for ");
            EXPECT_EQ(needles.size(), 1u + 4u) << "4 keys";
        }
        {
            spec.task = "niah_multivalue";
            const RulerSample s = make_ruler_sample(spec, 0, *tok);
            const std::string p = prompt_of(s);
            std::vector<std::string> found;
            const std::regex re("magic numbers for \\w+ is: (\\d+)\\.");
            for (auto it = std::sregex_iterator(p.begin(), p.end(), re); it != std::sregex_iterator(); ++it) found.push_back((*it)[1]);
            std::string joined;
            for (size_t i = 0; i < found.size(); ++i) joined += (i ? ", " : "") + found[i];
            EXPECT_EQ(found.size(), 4u);
            EXPECT_EQ(joined, s.answer);
        }
        {
            spec.task = "vt";
            const RulerSample s = make_ruler_sample(spec, 0, *tok);
            const std::string p = prompt_of(s);
            // Follow the chain in the text: the first VAR gets the number, each next copies one.
            std::map<std::string, std::string> val;
            const std::regex re("VAR (\\w+) = (VAR )?(\\w+)\\.");
            std::string chain;
            for (auto it = std::sregex_iterator(p.begin(), p.end(), re); it != std::sregex_iterator(); ++it) {
                const std::string v = (*it)[1], rhs = (*it)[3];
                val[v] = (*it)[2].matched ? val[rhs] : rhs;
            }
            std::smatch q;
            ASSERT_TRUE(std::regex_search(p, q, std::regex("assigned the value (\\d+)")));
            for (auto it = std::sregex_iterator(p.begin(), p.end(), re); it != std::sregex_iterator(); ++it)
                if (val[(*it)[1]] == q[1].str()) chain += (chain.empty() ? "" : " ") + (*it)[1].str();
            EXPECT_EQ(chain, s.answer);
            EXPECT_EQ(split(s.answer, " ").size(), 4u);
        }
        {
            spec.task = "cwe";
            const RulerSample s = make_ruler_sample(spec, 0, *tok);
            const std::string p = prompt_of(s);
            std::map<std::string, int> count;
            std::vector<std::string> first;
            const std::regex re(" \\d+\\. (\\w+)");
            for (auto it = std::sregex_iterator(p.begin(), p.end(), re); it != std::sregex_iterator(); ++it)
                if (count[(*it)[1]]++ == 0) first.push_back((*it)[1]);
            const auto answer = split(s.answer, ", ");
            ASSERT_EQ(answer.size(), 4u);
            int least_common = 1 << 30, most_other = 0;
            for (const auto& w : answer) least_common = std::min(least_common, count[w]);
            for (const auto& [w, c] : count)
                if (std::find(answer.begin(), answer.end(), w) == answer.end()) most_other = std::max(most_other, c);
            EXPECT_GT(least_common, most_other) << "the answer's words must be the most common";
            std::vector<std::string> order;
            for (const auto& w : first)
                if (std::find(answer.begin(), answer.end(), w) != answer.end()) order.push_back(w);
            EXPECT_EQ(order, answer) << "in order of first appearance";
        }
    }
}

TEST(RulerTask, ExactMatchScorerOnHandMadeAnswers) {
    // The tasks score with the repeat task's scorer: exact iff every answer token matches.
    EXPECT_TRUE(score_copy({5, 6, 7}, {5, 6, 7}).exact);
    EXPECT_FALSE(score_copy({5, 6, 7}, {5, 6, 8}).exact);
    EXPECT_FALSE(score_copy({5, 6, 7}, {5, 6}).exact);
    EXPECT_EQ(score_copy({5, 6, 7}, {9, 6, 7}).matches, 2);
    EXPECT_EQ(score_copy({5, 6, 7}, {9, 6, 7}).prefix, 0);
}

TEST(RulerTask, TooShortOrUnknownIsRefused) {
    auto tok = make_byte_tokenizer();
    RulerSpec spec;
    spec.task = "niah_multikey";
    spec.seq_length = 100;
    try {
        make_ruler_sample(spec, 0, *tok);
        FAIL() << "100 tokens cannot hold the prompt";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--data.seq_length: 100 tokens cannot hold the niah_multikey prompt"), std::string::npos) << e.what();
    }
    spec.task = "niah_double";
    spec.seq_length = 2000;
    EXPECT_THROW(make_ruler_sample(spec, 0, *tok), Error);
}

}  // namespace
}  // namespace kv
