// BPE against an independent reference on real prose: a BPE vocabulary is trained here on the
// Debian license texts (~240 KB of English), and the tokenizer's heap-based merge loop must give
// exactly what the textbook definition gives (apply each merge, in rank order, left to right).
// Also prints encode/decode throughput — printed only, never asserted (shared machines).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "formats/tokenizer/pre_tokenizer.h"
#include "formats/tokenizer/regex.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

using Word = std::vector<int32_t>;

std::string read_corpus() {
    namespace fs = std::filesystem;
    const fs::path dir = "/usr/share/common-licenses";
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& f : files) {
        std::ifstream in(f, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        text += ss.str();
    }
    return text;
}

struct Trained {
    std::vector<std::string> tokens;                 // id -> byte-level string
    std::vector<std::pair<int32_t, int32_t>> merges;  // rank order
    std::vector<int32_t> merged;                      // rank -> resulting id
};

// Textbook BPE training on word counts: repeatedly merge the most frequent adjacent pair
// (ties: smallest pair key), over the GPT-2 pre-tokenized words.
Trained train(const std::vector<std::string>& words, int n_merges) {
    Trained t;
    for (int b = 0; b < 256; ++b) t.tokens.push_back(byte_level_encode(std::string(1, char(b))));
    std::unordered_map<std::string, int32_t> by_text;
    for (int b = 0; b < 256; ++b) by_text[t.tokens[size_t(b)]] = b;
    std::unordered_map<std::string, int64_t> counts;
    for (const auto& w : words) ++counts[w];
    std::vector<std::pair<Word, int64_t>> ws;
    for (const auto& [w, c] : counts) ws.push_back({Word(w.begin(), w.end()), c});
    for (auto& [w, c] : ws)
        for (int32_t& x : w) x = int32_t(static_cast<uint8_t>(char(x)));
    for (int r = 0; r < n_merges; ++r) {
        std::unordered_map<uint64_t, int64_t> pairs;
        for (const auto& [w, c] : ws)
            for (size_t i = 0; i + 1 < w.size(); ++i) pairs[(uint64_t(w[i]) << 32) | uint32_t(w[i + 1])] += c;
        uint64_t best = 0;
        int64_t best_n = 0;
        for (const auto& [k, n] : pairs)
            if (n > best_n || (n == best_n && k < best)) best = k, best_n = n;
        if (best_n < 2) break;
        const int32_t a = int32_t(best >> 32), b = int32_t(best & 0xFFFFFFFF);
        const std::string text = t.tokens[size_t(a)] + t.tokens[size_t(b)];
        auto [it, fresh] = by_text.emplace(text, int32_t(t.tokens.size()));
        if (fresh) t.tokens.push_back(text);
        t.merges.push_back({a, b});
        t.merged.push_back(it->second);
        for (auto& [w, c] : ws) {
            Word out;
            for (size_t i = 0; i < w.size(); ++i) {
                if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
                    out.push_back(it->second);
                    ++i;
                } else {
                    out.push_back(w[i]);
                }
            }
            w.swap(out);
        }
    }
    return t;
}

// The definition: for each merge in rank order, merge its occurrences left to right.
Word reference_encode(const std::string& word, const Trained& t) {
    Word w;
    for (char c : word) w.push_back(int32_t(static_cast<uint8_t>(c)));
    for (size_t r = 0; r < t.merges.size() && w.size() > 1; ++r) {
        const auto [a, b] = t.merges[r];
        Word out;
        for (size_t i = 0; i < w.size(); ++i) {
            if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
                out.push_back(t.merged[r]);
                ++i;
            } else {
                out.push_back(w[i]);
            }
        }
        w.swap(out);
    }
    return w;
}

TEST(BpeReference, TrainedVocabularyMatchesTheDefinitionAndPrintsThroughput) {
    const std::string corpus = read_corpus();
    if (corpus.size() < 100000) GTEST_SKIP() << "/usr/share/common-licenses is missing or small";
    const Regex gpt2(pretok_pattern::kGpt2);
    std::vector<std::string> words;  // raw bytes of each GPT-2 pre-token
    split_by_regex(corpus, gpt2, SplitBehavior::ISOLATED, false, words);
    const Trained t = train(words, 1500);
    ASSERT_GT(t.merges.size(), 1000u);

    nlohmann::json vocab = nlohmann::json::object(), merges = nlohmann::json::array();
    for (size_t i = 0; i < t.tokens.size(); ++i) vocab[t.tokens[i]] = i;
    for (const auto& [a, b] : t.merges) merges.push_back(t.tokens[size_t(a)] + " " + t.tokens[size_t(b)]);
    const nlohmann::json j = test::gpt2_style_json(vocab, merges);

    Word expect;
    for (const std::string& w : words) {
        const Word r = reference_encode(w, t);
        expect.insert(expect.end(), r.begin(), r.end());
    }

    using clock = std::chrono::steady_clock;
    auto tok = test::load_json_tokenizer("trained", j);  // fresh tokenizer: empty word cache
    const auto t0 = clock::now();
    const std::vector<int32_t> ids = tok->encode(corpus, false);
    const auto t1 = clock::now();
    const std::vector<int32_t> again = tok->encode(corpus, false);
    const auto t2 = clock::now();
    const std::string back = tok->decode(ids);
    const auto t3 = clock::now();

    ASSERT_EQ(ids.size(), expect.size());
    EXPECT_TRUE(ids == expect) << "heap-based merges differ from the rank-order definition";
    EXPECT_EQ(again, ids);
    EXPECT_TRUE(back == corpus) << "decode(encode(corpus)) differs from the corpus";

    auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const double mb = double(corpus.size()) / 1e6;
    std::printf("[ perf ] tokenizer: %zu bytes -> %zu tokens (%zu merges); encode %.1f ms (%.1f MB/s) cold cache, "
                "%.1f ms warm; decode %.1f ms\n",
                corpus.size(), ids.size(), t.merges.size(), ms(t1 - t0), mb / (ms(t1 - t0) / 1e3), ms(t2 - t1),
                ms(t3 - t2));
}

}  // namespace
}  // namespace kv
