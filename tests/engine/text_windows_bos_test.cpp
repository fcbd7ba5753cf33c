// Text windows open with a BOS token only when the tokenizer adds one itself (GGUF
// tokenizer.ggml.add_bos_token, HF add_bos_token), as generate and llama.cpp's perplexity do.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "engine/data/text_windows.h"
#include "engine/model/byte_tokenizer.h"
#include "formats/tokenizer/tokenizer.h"

namespace kv {
namespace {

// Bytes as ids; BOS id 300 exists either way, prepended by encode() only when add_bos.
class FlagTokenizer : public Tokenizer {
   public:
    explicit FlagTokenizer(bool add_bos) : add_bos_(add_bos) {}
    std::string token_to_piece(int32_t id) const override { return std::string(1, char(id)); }
    int32_t token_id(const std::string&) const override { return -1; }
    int32_t vocab_size() const override { return 301; }
    int32_t bos_id() const override { return 300; }
    const std::vector<int32_t>& eos_ids() const override { return eos_; }
    int32_t pad_id() const override { return -1; }
    bool is_special(int32_t id) const override { return id >= 256; }
    std::string kind() const override { return "test"; }

   protected:
    std::vector<int32_t> encode_impl(const std::string& text, bool add_special, bool) const override {
        std::vector<int32_t> ids;
        if (add_special && add_bos_) ids.push_back(300);
        for (unsigned char c : text) ids.push_back(int32_t(c));
        return ids;
    }
    std::string decode_impl(const std::vector<int32_t>& ids, bool) const override {
        std::string s;
        for (int32_t id : ids) s += char(id);
        return s;
    }

   private:
    bool add_bos_;
    std::vector<int32_t> eos_ = {299};
};

std::string text_file() {
    const std::string path = testing::TempDir() + "/text_windows_bos.txt";
    std::ofstream(path) << "abcdefg";  // 7 bytes + the newline the loader appends
    return path;
}

TEST(TextWindowsBos, PrependedWhenTheTokenizerAddsOne) {
    const TextWindows w = make_text_windows({text_file()}, FlagTokenizer(true), 4, 10);
    EXPECT_TRUE(w.bos);
    ASSERT_EQ(w.windows.size(), 2u);
    EXPECT_EQ(w.windows[0], (std::vector<int32_t>{300, 'a', 'b', 'c'}));
    EXPECT_EQ(w.windows[1], (std::vector<int32_t>{'d', 'e', 'f', 'g'}));
}

TEST(TextWindowsBos, NoneWhenTheTokenizerAddsNoneThoughItHasABosId) {
    const TextWindows w = make_text_windows({text_file()}, FlagTokenizer(false), 4, 10);
    EXPECT_FALSE(w.bos);
    ASSERT_EQ(w.windows.size(), 2u);
    EXPECT_EQ(w.windows[0], (std::vector<int32_t>{'a', 'b', 'c', 'd'}));
    EXPECT_EQ(w.windows[1], (std::vector<int32_t>{'e', 'f', 'g', '\n'}));
}

TEST(TextWindowsBos, ByteTokenizerOfPresetsAddsNone) {
    // generate's prompts with the byte tokenizer have no BOS either ("hello" is 5 tokens).
    auto tok = make_byte_tokenizer();
    ASSERT_EQ(tok->encode("hello", true).size(), 5u);
    EXPECT_FALSE(make_text_windows({text_file()}, *tok, 4, 10).bos);
}

}  // namespace
}  // namespace kv
