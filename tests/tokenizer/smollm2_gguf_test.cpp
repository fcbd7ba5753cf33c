// The real target of make_bpe_tokenizer: SmolLM2-135M-Instruct's GGUF vocabulary (49152 tokens,
// 48900 merges, tokenizer.ggml.pre "smollm"), when scripts/fetch_assets.sh has put the model in
// assets/cache (skipped otherwise). Expected ids come from hand-split pre-tokens run through a
// textbook BPE (each merge, in rank order, left to right) over the file's own merges.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unordered_map>

#include "formats/tokenizer/utf8.h"
#include "tests/support/test_support.h"
#include "tokenizer_test_util.h"

namespace kv {
namespace {

const std::string kModel = std::string(KVLAB_SOURCE_DIR) + "/assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

// Just enough of GGUF v3 to read the tokenizer.ggml.* metadata (test-only; the product reader
// lives in formats/gguf, which this suite does not link).
struct GgufMeta {
    std::vector<std::string> tokens, merges;
    std::vector<int32_t> types;
    std::string pre;
    int64_t bos = -1, eos = -1, pad = -1;
    int add_bos = -1;
};

class MetaReader {
   public:
    explicit MetaReader(std::istream& in) : in_(in) {}
    template <class T>
    T pod() {
        T v{};
        in_.read(reinterpret_cast<char*>(&v), sizeof(T));
        if (!in_) throw std::runtime_error("truncated GGUF");
        return v;
    }
    std::string str() {
        const auto n = pod<uint64_t>();
        std::string s(n, '\0');
        in_.read(s.data(), std::streamsize(n));
        return s;
    }
    // Reads one value of `type`; integers are returned through *i, strings appended to *out.
    void value(uint32_t type, int64_t* i, std::vector<std::string>* out, std::vector<int32_t>* ints) {
        switch (type) {
            case 0: *i = pod<uint8_t>(); break;
            case 1: *i = pod<int8_t>(); break;
            case 2: *i = pod<uint16_t>(); break;
            case 3: *i = pod<int16_t>(); break;
            case 4: *i = pod<uint32_t>(); break;
            case 5: *i = pod<int32_t>(); break;
            case 6: (void)pod<float>(); break;
            case 7: *i = pod<uint8_t>(); break;
            case 8: {
                std::string s = str();
                if (out) out->push_back(std::move(s));
                break;
            }
            case 9: {
                const auto et = pod<uint32_t>();
                const auto n = pod<uint64_t>();
                for (uint64_t k = 0; k < n; ++k) {
                    int64_t x = 0;
                    value(et, &x, out, nullptr);
                    if (ints && et != 8) ints->push_back(int32_t(x));
                }
                break;
            }
            case 10: *i = int64_t(pod<uint64_t>()); break;
            case 11: *i = pod<int64_t>(); break;
            case 12: (void)pod<double>(); break;
            default: throw std::runtime_error("unknown GGUF type");
        }
    }

   private:
    std::istream& in_;
};

GgufMeta read_meta(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    MetaReader r(f);
    if (r.pod<uint32_t>() != 0x46554747u) throw std::runtime_error("not GGUF");  // "GGUF"
    (void)r.pod<uint32_t>();  // version
    (void)r.pod<uint64_t>();  // tensor count
    const auto n_kv = r.pod<uint64_t>();
    GgufMeta m;
    for (uint64_t k = 0; k < n_kv; ++k) {
        const std::string key = r.str();
        const auto type = r.pod<uint32_t>();
        int64_t i = 0;
        std::vector<std::string> strs;
        std::vector<int32_t> ints;
        r.value(type, &i, &strs, &ints);
        if (key == "tokenizer.ggml.tokens") m.tokens = std::move(strs);
        if (key == "tokenizer.ggml.merges") m.merges = std::move(strs);
        if (key == "tokenizer.ggml.token_type") m.types = std::move(ints);
        if (key == "tokenizer.ggml.pre") m.pre = strs.at(0);
        if (key == "tokenizer.ggml.bos_token_id") m.bos = i;
        if (key == "tokenizer.ggml.eos_token_id") m.eos = i;
        if (key == "tokenizer.ggml.padding_token_id") m.pad = i;
        if (key == "tokenizer.ggml.add_bos_token") m.add_bos = int(i);
    }
    return m;
}

class SmolLm2Gguf : public ::testing::Test {
   protected:
    static void SetUpTestSuite() {
        if (!std::filesystem::exists(kModel)) return;
        meta_ = new GgufMeta(read_meta(kModel));
        tok_ = make_bpe_tokenizer(meta_->tokens, meta_->merges, meta_->types, int32_t(meta_->bos),
                                  int32_t(meta_->eos), int32_t(meta_->pad), meta_->pre,
                                  meta_->add_bos < 0 ? std::nullopt : std::optional<bool>(meta_->add_bos != 0),
                                  std::nullopt, kModel)
                   .release();
        for (size_t i = 0; i < meta_->tokens.size(); ++i) ids_.emplace(meta_->tokens[i], int32_t(i));
    }
    static void TearDownTestSuite() {
        delete tok_;
        delete meta_;
    }
    void SetUp() override {
        if (!tok_) GTEST_SKIP() << kModel << " is not there (scripts/fetch_assets.sh fetches it)";
    }

    // Textbook BPE of one pre-token (raw bytes) with the file's merges.
    static std::vector<int32_t> reference(const std::string& raw) {
        const std::string mapped = byte_level_encode(raw);
        std::vector<std::string> sym;
        for (size_t i = 0; i < mapped.size();) {
            const size_t n = utf8::char_len_or_one(mapped, i);
            sym.push_back(mapped.substr(i, n));
            i += n;
        }
        for (const std::string& m : meta_->merges) {
            if (sym.size() < 2) break;
            const size_t sp = m.find(' ', 1);
            const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
            std::vector<std::string> out;
            for (size_t i = 0; i < sym.size(); ++i) {
                if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
                    out.push_back(a + b);
                    ++i;
                } else {
                    out.push_back(sym[i]);
                }
            }
            sym.swap(out);
        }
        std::vector<int32_t> ids;
        for (const std::string& s : sym) ids.push_back(ids_.at(s));
        return ids;
    }
    static std::vector<int32_t> reference(const std::vector<std::string>& pre_tokens) {
        std::vector<int32_t> all;
        for (const std::string& p : pre_tokens) {
            const auto r = reference(p);
            all.insert(all.end(), r.begin(), r.end());
        }
        return all;
    }

    static GgufMeta* meta_;
    static Tokenizer* tok_;
    static std::unordered_map<std::string, int32_t> ids_;
};
GgufMeta* SmolLm2Gguf::meta_ = nullptr;
Tokenizer* SmolLm2Gguf::tok_ = nullptr;
std::unordered_map<std::string, int32_t> SmolLm2Gguf::ids_;

TEST_F(SmolLm2Gguf, VocabularyFacts) {
    EXPECT_EQ(meta_->pre, "smollm");
    EXPECT_EQ(tok_->vocab_size(), 49152);
    EXPECT_EQ(tok_->bos_id(), 1);
    EXPECT_EQ(tok_->token_to_piece(1), "<|im_start|>");
    EXPECT_EQ(tok_->eos_id(), 2);
    EXPECT_EQ(tok_->token_to_piece(2), "<|im_end|>");
    EXPECT_EQ(tok_->eos_ids(), (std::vector<int32_t>{2, 0}));  // <|endoftext|> also ends generation
    EXPECT_EQ(tok_->pad_id(), 2);
    for (int32_t id = 0; id < 17; ++id) EXPECT_TRUE(tok_->is_special(id)) << id;
    EXPECT_FALSE(tok_->is_special(17));
    EXPECT_EQ(tok_->token_id("\n"), ids_.at("\xC4\x8A"));  // "Ċ"
    EXPECT_EQ(tok_->token_id(" "), ids_.at("\xC4\xA0"));   // "Ġ"
    for (const char* label : {"A", "B", "C", "D"}) EXPECT_EQ(tok_->token_id(label), ids_.at(label));
}

TEST_F(SmolLm2Gguf, EncodingsMatchHandSplitsAndTextbookBpe) {
    using P = std::vector<std::string>;
    // Pre-tokens by hand: every digit alone (Digits), then the GPT-2 regex (see PreTokenizer tests).
    const std::vector<std::pair<std::string, P>> cases = {
        {"Hello, we can use", {"Hello", ",", " we", " can", " use"}},
        {"The capital of France is", {"The", " capital", " of", " France", " is"}},
        {"Hello world! 123", {"Hello", " world", "!", " ", "1", "2", "3"}},
        {"Caf\xC3\xA9 d\xC3\xA9j\xC3\xA0 vu.", {"Caf\xC3\xA9", " d\xC3\xA9j\xC3\xA0", " vu", "."}},
        {"  multiple   spaces", {" ", " multiple", "  ", " spaces"}},
        {"I'm 2024's\n\n", {"I", "'m", " ", "2", "0", "2", "4", "'s", "\n\n"}},
        {"x = f(y) + 3.14;\tdone", {"x", " =", " f", "(", "y", ")", " +", " ", "3", ".", "1", "4", ";", "\t", "done"}},
    };
    for (const auto& [text, pre] : cases) {
        const auto ids = tok_->encode(text, false);
        EXPECT_EQ(ids, reference(pre)) << "text: \"" << text << "\" pieces: " << ::testing::PrintToString(test::pieces_of(*tok_, ids));
        EXPECT_EQ(tok_->decode(ids), text);
    }
    // Spot pieces: whole-word tokens exist for these common words.
    EXPECT_EQ(test::pieces_of(*tok_, tok_->encode("  multiple   spaces", false)), (P{" ", " multiple", "  ", " spaces"}));
    EXPECT_EQ(tok_->encode("\n", false), (std::vector<int32_t>{ids_.at("\xC4\x8A")}));
}

TEST_F(SmolLm2Gguf, ChatMarkupAndRoundTrips) {
    const std::string chat = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    const auto ids = tok_->encode(chat);
    EXPECT_EQ(ids.front(), 1);  // the marker itself; add_bos_token is false in this file
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 2);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 1);
    EXPECT_EQ(tok_->decode(ids), chat);
    EXPECT_EQ(tok_->decode(ids, true), "user\nWhat is 2+2?\nassistant\n");
    // The vocabulary holds only the byte characters its training data had: 21 bytes (C0, C1,
    // F5..FF never occur in UTF-8; a few control bytes never occurred) have no token. With no unk
    // token and no byte fallback they are dropped, as Hugging Face and llama.cpp drop them.
    std::vector<char> present, missing;
    for (int b = 0; b < 256; ++b)
        (ids_.count(byte_level_encode(std::string(1, char(b)))) ? present : missing).push_back(char(b));
    EXPECT_EQ(missing.size(), 21u);
    for (char m : missing) EXPECT_EQ(tok_->decode(tok_->encode(std::string("a") + m + "b", false)), "ab");
    std::mt19937_64 rng(test::seed_for("SmolLm2Gguf.RoundTrip"));
    for (int n = 0; n < 100; ++n) {
        std::string s(size_t(rng() % 80), '\0');
        for (char& c : s) c = present[rng() % present.size()];
        EXPECT_EQ(tok_->decode(tok_->encode(s, false, false)), s);
    }
    for (const std::string s : {"\xF0\x9F\x98\x80 emoji", "\xE4\xB8\xAD\xE6\x96\x87 CJK", "tab\there\r\n"})
        EXPECT_EQ(tok_->decode(tok_->encode(s, false)), s);
}

TEST_F(SmolLm2Gguf, ThroughputOnEnglishProse) {
    namespace fs = std::filesystem;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/usr/share/common-licenses", ec))
        if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::string text;
    for (const auto& p : files) {
        std::ifstream in(p, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        text += ss.str();
    }
    if (text.size() < 100000) GTEST_SKIP() << "no license texts to tokenize";
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    const auto ids = tok_->encode(text, false, false);
    const auto t1 = clock::now();
    const std::string back = tok_->decode(ids);
    const auto t2 = clock::now();
    EXPECT_TRUE(back == text);
    const double enc_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    const double dec_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    std::printf("[ perf ] SmolLM2 vocab: %zu bytes of license text -> %zu tokens; encode %.1f ms (%.1f MB/s), "
                "decode %.1f ms\n",
                text.size(), ids.size(), enc_ms, double(text.size()) / 1e3 / enc_ms, dec_ms);
}

}  // namespace
}  // namespace kv
