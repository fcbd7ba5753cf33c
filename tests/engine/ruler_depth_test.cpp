// RulerSpec::depth, the needle-in-a-haystack grid's depth: the one needle sits at floor(d * room)
// tokens into the haystack (room = haystack tokens around it), read back from the token ids
// (the byte tokenizer: one token per byte), and moving it changes nothing else of the sample;
// tasks hiding several sentences refuse a depth naming --data.depths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/data/ruler.h"
#include "engine/model/byte_tokenizer.h"

namespace kv {
namespace {

// Where `needle` starts in ids, -1 when absent.
int64_t find_tokens(const std::vector<int32_t>& ids, const std::vector<int32_t>& needle) {
    const auto it = std::search(ids.begin(), ids.end(), needle.begin(), needle.end());
    return it == ids.end() ? -1 : int64_t(it - ids.begin());
}

TEST(RulerDepth, TheNeedleSitsAtTheDepthAndNothingElseMoves) {
    auto tok = make_byte_tokenizer();
    for (const std::string task : {"niah_single", "niah_single_2"}) {
        SCOPED_TRACE(task);
        RulerSpec spec;
        spec.task = task;
        spec.seq_length = 1500;
        spec.depth = 0.0;
        const RulerSample s0 = make_ruler_sample(spec, 3, *tok);
        // The needle's text, from the answer the sample claims (the key is in the answer prefix).
        const std::string prompt = tok->decode(std::vector<int32_t>(s0.ids.begin(), s0.ids.begin() + s0.answer_start));
        const size_t kf = prompt.rfind("for ") + 4, ke = prompt.find(" mentioned", kf);
        const std::string key = prompt.substr(kf, ke - kf);
        const std::vector<int32_t> needle = tok->encode(" One of the special magic numbers for " + key + " is: " + s0.answer + ".", false);
        const int64_t n = int64_t(needle.size());
        const int64_t start = find_tokens(s0.ids, needle);  // depth 0: the haystack's first token
        ASSERT_GT(start, 0);
        const int64_t room = s0.question_start - start - n;  // haystack tokens around the needle
        ASSERT_GT(room, 1000);
        auto without_needle = [&](const RulerSample& s, int64_t at) {
            std::vector<int32_t> v(s.ids);
            v.erase(v.begin() + at, v.begin() + at + n);
            return v;
        };
        const std::vector<int32_t> rest0 = without_needle(s0, start);
        for (double d : {0.25, 0.5, 0.9, 1.0}) {
            spec.depth = d;
            const RulerSample s = make_ruler_sample(spec, 3, *tok);
            ASSERT_EQ(s.ids.size(), s0.ids.size()) << d;
            EXPECT_EQ(s.question_start, s0.question_start);
            EXPECT_EQ(s.answer, s0.answer);
            const int64_t at = find_tokens(s.ids, needle);
            ASSERT_GE(at, 0) << d;
            EXPECT_EQ(at - start, int64_t(std::floor(d * double(room)))) << "depth " << d;
            EXPECT_EQ(without_needle(s, at), rest0) << "depth " << d << ": only the needle moves";
        }
        // Unset: a random depth in [0.05, 0.95], the same sample as before depths existed.
        spec.depth = -1;
        const RulerSample r = make_ruler_sample(spec, 3, *tok);
        const int64_t at = find_tokens(r.ids, needle);
        ASSERT_GE(at, 0);
        EXPECT_GE(at - start, int64_t(0.05 * double(room)) - 1);
        EXPECT_LE(at - start, int64_t(0.95 * double(room)) + 1);
        EXPECT_EQ(without_needle(r, at), rest0);
    }
}

TEST(RulerDepth, TasksWithSeveralSentencesRefuseADepth) {
    auto tok = make_byte_tokenizer();
    for (const std::string task : {"niah_multikey", "niah_multivalue", "vt", "cwe"}) {
        RulerSpec spec;
        spec.task = task;
        spec.seq_length = 1500;
        spec.depth = 0.5;
        try {
            make_ruler_sample(spec, 0, *tok);
            FAIL() << task << " took a depth";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("--data.depths"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("expected a task hiding one needle"), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace kv
