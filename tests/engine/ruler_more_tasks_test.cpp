// RULER's other eight tasks (engine/data/ruler.h: niah_single_2/3, niah_multikey_2/3,
// niah_multiquery, fwe, qa_1, qa_2): each answer is read back from the decoded prompt by the
// task's own rule (not from the generator's bookkeeping), and RULER's text metric is checked on
// hand-worked predictions. Lengths and determinism of every task: ruler_task_test.cpp.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

std::vector<std::string> matches(const std::string& text, const std::string& re, int group = 1) {
    std::vector<std::string> out;
    const std::regex r(re);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator(); ++it) out.push_back((*it)[group]);
    return out;
}

struct Decoded {
    RulerSample s;
    std::string prompt;
};

Decoded sample(const std::string& task, uint64_t seed, int64_t T = 2000, int64_t keys = 4) {
    auto tok = make_byte_tokenizer();
    RulerSpec spec;
    spec.task = task;
    spec.seq_length = T;
    spec.seed = seed;
    spec.num_keys = keys;
    Decoded d;
    d.s = make_ruler_sample(spec, 0, *tok);
    d.prompt = tok->decode(std::vector<int32_t>(d.s.ids.begin(), d.s.ids.begin() + d.s.answer_start));
    return d;
}

const char* const kUuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}";

TEST(RulerMoreTasks, ThirteenTasks) {
    EXPECT_EQ(ruler_task_names().size(), 13u);
    for (const char* t : {"niah_single_2", "niah_single_3", "niah_multikey_2", "niah_multikey_3", "niah_multiquery", "fwe", "qa_1", "qa_2"})
        EXPECT_TRUE(is_ruler_task(t)) << t;
}

TEST(RulerMoreTasks, SingleNeedleInEssayProseWithNumberOrUuid) {
    for (uint64_t seed : {1u, 2u, 3u}) {
        const Decoded n2 = sample("niah_single_2", seed);
        EXPECT_TRUE(std::regex_match(n2.s.answer, std::regex("\\d{7}"))) << n2.s.answer;
        int essay = 0;
        for (const char* phrase : {"so few people work on them", "how much of it you did not", "what to leave out", "quietly encourage you"})
            essay += n2.prompt.find(phrase) != std::string::npos;
        EXPECT_GE(essay, 1) << "the essay haystack";
        EXPECT_EQ(n2.prompt.find("The grass is green"), std::string::npos) << "not the noise haystack";
        // The question names the key, and the answer's first words name it again.
        const auto key2 = matches(n2.prompt, "special magic number for (\\w+) mentioned");
        ASSERT_EQ(key2.size(), 2u);
        EXPECT_EQ(key2[0], key2[1]);
        EXPECT_EQ(matches(n2.prompt, "magic numbers for " + key2[0] + " is: (\\d+)\\."), std::vector<std::string>{n2.s.answer});

        const Decoded n3 = sample("niah_single_3", seed);
        EXPECT_TRUE(std::regex_match(n3.s.answer, std::regex(kUuid))) << n3.s.answer;
        const auto key3 = matches(n3.prompt, "special magic uuid for (\\w+) mentioned");
        ASSERT_EQ(key3.size(), 2u);
        EXPECT_EQ(key3[0], key3[1]);
        EXPECT_EQ(matches(n3.prompt, "magic uuids for " + key3[0] + " is: (" + kUuid + ")\\."), std::vector<std::string>{n3.s.answer});
    }
}

TEST(RulerMoreTasks, OneNeedleAmongOtherNeedlesWithDistinctKeys) {
    for (const auto& [task, key_re, value_re] :
         std::vector<std::tuple<std::string, std::string, std::string>>{{"niah_multikey_2", "[a-z]+-[a-z]+(?:-[a-z]+)?", "\\d{7}"},
                                                                       {"niah_multikey_3", kUuid, kUuid}}) {
        SCOPED_TRACE(task);
        for (uint64_t seed : {1u, 2u}) {
            const Decoded d = sample(task, seed);
            const std::string what = task == "niah_multikey_2" ? "number" : "uuid";
            const auto asked = matches(d.prompt, "special magic " + what + " for (" + key_re + ") mentioned");
            ASSERT_EQ(asked.size(), 2u);  // the question and the answer's first words
            EXPECT_EQ(asked[0], asked[1]);
            const auto keys = matches(d.prompt, "One of the special magic " + what + "s for (" + key_re + ") is: " + value_re + "\\.");
            EXPECT_GE(keys.size(), 4u) << "the haystack is needles";
            EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()).size(), keys.size()) << "every key once";
            EXPECT_EQ(matches(d.prompt, "magic " + what + "s for " + asked[0] + " is: (" + value_re + ")\\."),
                      std::vector<std::string>{d.s.answer});
        }
    }
}

TEST(RulerMoreTasks, MultiQueryAnswersEveryAskedKeyInOrder) {
    for (int64_t keys : {2, 4, 6}) {
        const Decoded d = sample("niah_multiquery", 5, 2000, keys);
        const auto q = matches(d.prompt, "What are all the special magic numbers for ([\\w, ]+) mentioned");
        ASSERT_EQ(q.size(), 1u);
        // "a, b and c" -> a, b, c
        std::vector<std::string> asked = matches(std::regex_replace(q[0], std::regex(" and "), ", "), "(\\w+)");
        EXPECT_EQ(int64_t(asked.size()), std::min<int64_t>(keys, 4));
        std::string want;
        for (const auto& k : asked) {
            const auto v = matches(d.prompt, "magic numbers for " + k + " is: (\\d+)\\.");
            ASSERT_EQ(v.size(), 1u) << k;
            want += (want.empty() ? "" : ", ") + v[0];
        }
        EXPECT_EQ(d.s.answer, want);
        EXPECT_EQ(int64_t(matches(d.prompt, "One of the special magic numbers for (\\w+) is").size()), keys);
    }
}

TEST(RulerMoreTasks, FrequentWordsAreTheThreeMostFrequentCodedWords) {
    for (uint64_t seed : {1u, 2u, 3u})
        for (int64_t T : {1024, 4096}) {
            const Decoded d = sample("fwe", seed, T);
            std::map<std::string, int> count;
            // The coded text: between the instruction and the question, words of four syllables.
            const size_t a = d.prompt.find("coded words.\n"), b = d.prompt.find("\n Question:");
            ASSERT_TRUE(a != std::string::npos && b != std::string::npos && a < b);
            const std::string coded = d.prompt.substr(a, b - a);
            for (const auto& w : matches(coded, " ((?:ka|lo|mi|nu|pe|ri|so|ta|ve|zo|bi|du|fa|ge|ho|ju){4})(?= |$)")) ++count[w];
            std::vector<std::pair<int, std::string>> by;
            for (const auto& [w, c] : count) by.push_back({c, w});
            std::sort(by.rbegin(), by.rend());
            ASSERT_GE(by.size(), 4u);
            EXPECT_GT(by[2].first, by[3].first) << "the third strictly ahead of the fourth";
            EXPECT_GT(by[0].first, by[1].first);
            EXPECT_GT(by[1].first, by[2].first);
            EXPECT_EQ(d.s.answer, by[0].second + ", " + by[1].second + ", " + by[2].second) << "T=" << T;
        }
}

TEST(RulerMoreTasks, QaAnswersFollowTheDocuments) {
    for (uint64_t seed : {1u, 2u, 3u}) {
        const Decoded q1 = sample("qa_1", seed);
        const auto town = matches(q1.prompt, "In which year was (\\w+) founded\\?");
        ASSERT_EQ(town.size(), 1u);
        EXPECT_EQ(matches(q1.prompt, "Document \\d+: " + town[0] + " is a town in the province of \\w+\\. It was founded in (\\d+)"),
                  std::vector<std::string>{q1.s.answer});
        EXPECT_GE(matches(q1.prompt, "Document (\\d+):").size(), 4u) << "distractor documents";

        const Decoded q2 = sample("qa_2", seed);
        const auto person = matches(q2.prompt, "river lies the town where (\\w+) was born\\?");
        ASSERT_EQ(person.size(), 1u);
        const auto born = matches(q2.prompt, "Document \\d+: " + person[0] + " was born in (\\w+) ");
        ASSERT_EQ(born.size(), 1u);
        EXPECT_EQ(matches(q2.prompt, "Document \\d+: " + born[0] + " lies on the river (\\w+),"), std::vector<std::string>{q2.s.answer});
    }
}

TEST(RulerMoreTasks, TextMetricOnHandWorkedPredictions) {
    // string_match_all: the share of the answer's items in the prediction, case-insensitive.
    EXPECT_EQ(ruler_text_score("niah_multivalue", "4417001 and 9120345", "9120345, 4417001"), 1.0);
    EXPECT_EQ(ruler_text_score("niah_multivalue", "only 9120345", "9120345, 4417001"), 0.5);
    EXPECT_EQ(ruler_text_score("niah_single", "the number is 1234567.", "1234567"), 1.0);
    EXPECT_EQ(ruler_text_score("niah_single", "1234568", "1234567"), 0.0);
    EXPECT_EQ(ruler_text_score("vt", "qwert, ASDFG", "QWERT ASDFG ZXCVB"), 2.0 / 3.0);  // vt splits at spaces
    EXPECT_EQ(ruler_text_score("fwe", "kalomipe, risotave", "kalomipe, risotave, vezobidu"), 2.0 / 3.0);
    // string_match_part: all or nothing.
    EXPECT_EQ(ruler_text_score("qa_1", "It was founded in 1450.", "1450"), 1.0);
    EXPECT_EQ(ruler_text_score("qa_2", "the river Kalo", "Kalomi"), 0.0);
    EXPECT_THROW(ruler_text_score("niah_double", "", "x"), Error);
}

}  // namespace
}  // namespace kv
