// --ignore_eos: generation runs exactly max_new_tokens past end-of-sequence tokens (fixed-length
// benchmarks such as tools/reference/llama_cpp_bench.sh need it), greedy and beam alike; without
// it the first EOS stops the run.
#include <gtest/gtest.h>

#include <numeric>

#include "engine/generate/generator.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/presets.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

// The byte tokenizer with every id declared end-of-sequence: any generated token is an EOS.
class AllEosTokenizer : public Tokenizer {
   public:
    AllEosTokenizer() : base_(make_byte_tokenizer()), eos_(size_t(base_->vocab_size())) {
        std::iota(eos_.begin(), eos_.end(), 0);
    }
    std::string token_to_piece(int32_t id) const override { return base_->token_to_piece(id); }
    int32_t token_id(const std::string& p) const override { return base_->token_id(p); }
    int32_t vocab_size() const override { return base_->vocab_size(); }
    int32_t bos_id() const override { return base_->bos_id(); }
    const std::vector<int32_t>& eos_ids() const override { return eos_; }
    int32_t pad_id() const override { return base_->pad_id(); }
    bool is_special(int32_t id) const override { return base_->is_special(id); }
    std::string kind() const override { return "test"; }

   protected:
    std::vector<int32_t> encode_impl(const std::string& t, bool s, bool) const override { return base_->encode(t, s); }
    std::string decode_impl(const std::vector<int32_t>& ids, bool) const override { return base_->decode(ids, false); }

   private:
    std::unique_ptr<Tokenizer> base_;
    std::vector<int32_t> eos_;
};

TEST(GenerationIgnoreEos, RunsExactlyMaxNewTokensPastEosGreedyAndBeam) {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 11, DType::F32), ModelOptions{}};
    AllEosTokenizer tok;
    const std::vector<int32_t> prompt = tok.encode("abc", false);
    KVCacheConfig kc;
    GenerateConfig g;
    g.max_new_tokens = 7;
    g.temperature = 0;
    GenerationResult stopped = generate(model, tok, prompt, g, kc);
    EXPECT_EQ(stopped.stop_reason, "eos");
    EXPECT_TRUE(stopped.tokens.empty());

    g.ignore_eos = true;
    GenerationResult all = generate(model, tok, prompt, g, kc);
    EXPECT_EQ(all.stop_reason, "max_new_tokens");
    ASSERT_EQ(all.tokens.size(), 7u);
    // The same tokens as greedy by hand: argmax of a full forward over the growing sequence.
    std::vector<int32_t> seq = prompt;
    for (size_t i = 0; i < all.tokens.size(); ++i) {
        Tensor logits = model.forward(Tensor::from_i32({1, int64_t(seq.size())}, seq));
        std::vector<float> z = logits.slice(1, int64_t(seq.size()) - 1, int64_t(seq.size())).contiguous().to_f32_vector();
        const int32_t nxt = int32_t(std::max_element(z.begin(), z.end()) - z.begin());
        EXPECT_EQ(all.tokens[i], nxt) << "token " << i;
        seq.push_back(nxt);
    }

    g.beam_width = 2;
    g.ignore_eos = false;
    EXPECT_TRUE(generate(model, tok, prompt, g, kc).tokens.empty());
    g.ignore_eos = true;
    GenerationResult beam = generate(model, tok, prompt, g, kc);
    EXPECT_EQ(beam.tokens.size(), 7u);
}

}  // namespace
}  // namespace kv
