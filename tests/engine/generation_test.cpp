// Sampling and generation properties: top-k never leaves the k best; top-p keeps the smallest
// most-probable set with mass >= p; temperature 0 equals greedy; beam width 1 equals greedy;
// the same seed gives the same output; greedy decoding through the cache reproduces the
// PyTorch reference's greedy tokens (computed without a cache); stop strings end the text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "engine/generate/generator.h"
#include "engine/generate/sampler.h"
#include "formats/io/hf_folder.h"
#include "formats/io/safetensors_file.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/presets.h"
#include "tests/support/test_support.h"

namespace kv {
namespace {

std::vector<float> random_logits(int64_t V, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 2.0f);
    std::vector<float> z((size_t)V);
    for (auto& x : z) x = n(rng);
    return z;
}

TEST(Sampling, TopKNeverLeavesTheKBest) {
    const int64_t V = 500;
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> z = random_logits(V, test::seed_for("topk") + uint64_t(trial));
        std::vector<float> sorted = z;
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        const int64_t k = 1 + trial % 17;
        std::mt19937_64 rng(trial);
        SamplingParams p{1.5, k, 1.0};
        for (int i = 0; i < 300; ++i) {
            int32_t t = sample_token(z.data(), V, p, rng);
            ASSERT_GE(z[size_t(t)], sorted[size_t(k - 1)]) << "sampled outside the top " << k;
        }
    }
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
    const int64_t V = 300;
    for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> z = random_logits(V, test::seed_for("topp") + uint64_t(trial));
        const double top_p = 0.1 + 0.04 * trial, temp = 0.7;
        Candidates c = sampling_candidates(z.data(), V, SamplingParams{temp, 0, top_p});
        // Independent: full softmax in f64, sort descending, smallest prefix with mass >= p.
        std::vector<double> pr((size_t)V);
        double m = *std::max_element(z.begin(), z.end()), s = 0;
        for (int64_t v = 0; v < V; ++v) s += (pr[size_t(v)] = std::exp((double(z[size_t(v)]) - m) / temp));
        for (auto& x : pr) x /= s;
        std::vector<int32_t> idx((size_t)V);
        std::iota(idx.begin(), idx.end(), 0);
        std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return pr[size_t(a)] > pr[size_t(b)]; });
        double mass = 0;
        size_t n = 0;
        while (mass < top_p) mass += pr[size_t(idx[n++])];
        ASSERT_EQ(c.ids.size(), n) << "top_p " << top_p;
        EXPECT_EQ(std::set<int32_t>(c.ids.begin(), c.ids.end()), std::set<int32_t>(idx.begin(), idx.begin() + long(n)));
        // removing the least likely kept token drops the mass below p
        EXPECT_LT(mass - pr[size_t(idx[n - 1])], top_p);
    }
}

TEST(Sampling, TemperatureZeroIsGreedyAndSeedsRepeat) {
    std::vector<float> z = random_logits(1000, 5);
    std::mt19937_64 rng(1);
    EXPECT_EQ(sample_token(z.data(), 1000, SamplingParams{0.0, 50, 0.9}, rng), argmax(z.data(), 1000));
    std::mt19937_64 a(42), b(42);
    for (int i = 0; i < 50; ++i)
        EXPECT_EQ(sample_token(z.data(), 1000, SamplingParams{1.0, 0, 1.0}, a), sample_token(z.data(), 1000, SamplingParams{1.0, 0, 1.0}, b));
}

struct Tiny {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 11, DType::F32), ModelOptions{}};
    std::unique_ptr<Tokenizer> tok = make_byte_tokenizer();
};

TEST(Generation, TemperatureZeroAndBeamOneEqualGreedyAndSeedsRepeat) {
    Tiny t;
    std::vector<int32_t> prompt = t.tok->encode("The quick brown fox", false);
    KVCacheConfig kc;  // dense, sized to the prompt + new tokens
    GenerateConfig g;
    g.max_new_tokens = 24;
    g.temperature = 0;
    GenerationResult greedy = generate(t.model, *t.tok, prompt, g, kc);
    // Greedy by hand: argmax of a full forward over the growing sequence (no cache).
    std::vector<int32_t> seq = prompt, want;
    for (int i = 0; i < 24; ++i) {
        Tensor logits = t.model.forward(Tensor::from_i32({1, int64_t(seq.size())}, seq));
        std::vector<float> z = logits.slice(1, int64_t(seq.size()) - 1, int64_t(seq.size())).contiguous().to_f32_vector();
        const int32_t nxt = argmax(z.data(), int64_t(z.size()));
        if (nxt == kByteEos) break;
        want.push_back(nxt);
        seq.push_back(nxt);
    }
    EXPECT_EQ(greedy.tokens, want);
    g.beam_width = 1;
    EXPECT_EQ(generate(t.model, *t.tok, prompt, g, kc).tokens, want);
    g.temperature = 1.0;
    g.top_k = 20;
    g.seed = 99;
    GenerationResult a = generate(t.model, *t.tok, prompt, g, kc), b = generate(t.model, *t.tok, prompt, g, kc);
    EXPECT_EQ(a.tokens, b.tokens);
    // lastrec cache with a small window generates too (tokens evicted on the way)
    KVCacheConfig lr;
    lr.name = "lastrec-default";
    lr.cache_length = 24;
    g.temperature = 0;
    EXPECT_EQ(generate(t.model, *t.tok, prompt, g, lr).tokens.size() > 0, true);
}

TEST(Generation, BeamSearchFindsAtLeastGreedyScore) {
    Tiny t;
    std::vector<int32_t> prompt = t.tok->encode("abc", false);
    GenerateConfig g;
    g.max_new_tokens = 6;
    g.temperature = 0;
    g.length_penalty = 0;  // plain sum of log-probabilities
    KVCacheConfig kc;
    auto score = [&](const std::vector<int32_t>& gen) {  // log-probability of `gen` after the prompt
        std::vector<int32_t> seq = prompt;
        double lp = 0;
        for (int32_t tk : gen) {
            Tensor l = t.model.forward(Tensor::from_i32({1, int64_t(seq.size())}, seq));
            std::vector<float> z = l.slice(1, int64_t(seq.size()) - 1, int64_t(seq.size())).contiguous().to_f32_vector();
            double m = *std::max_element(z.begin(), z.end()), s = 0;
            for (float x : z) s += std::exp(double(x) - m);
            lp += double(z[size_t(tk)]) - m - std::log(s);
            seq.push_back(tk);
        }
        return lp;
    };
    GenerationResult greedy = generate(t.model, *t.tok, prompt, g, kc);
    g.beam_width = 4;
    GenerationResult beam = generate(t.model, *t.tok, prompt, g, kc);
    ASSERT_EQ(beam.tokens.size(), greedy.tokens.size());
    EXPECT_GE(score(beam.tokens), score(greedy.tokens) - 1e-6);
}

TEST(Generation, StopStringsEndTheText) {
    // A byte model that has learned nothing still produces bytes; pick a stop string from the
    // greedy output itself so it is sure to appear.
    Tiny t;
    std::vector<int32_t> prompt = t.tok->encode("xyz", false);
    GenerateConfig g;
    g.max_new_tokens = 30;
    g.temperature = 0;
    GenerationResult full = generate(t.model, *t.tok, prompt, g, KVCacheConfig{});
    ASSERT_GE(full.text.size(), 6u);
    g.stop = {full.text.substr(3, 2)};
    std::string streamed;
    GenerationCallbacks cb;
    cb.on_text = [&](const std::string& s) { streamed += s; };
    GenerationResult cut = generate(t.model, *t.tok, prompt, g, KVCacheConfig{}, cb);
    EXPECT_EQ(cut.stop_reason, "stop string");
    EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(g.stop[0])));
    EXPECT_EQ(streamed, cut.text);
}

TEST(Generation, GreedyMatchesPyTorchReferenceOnFixtures) {
    // The windowed fixtures generate past their window (prompt 5 + 8 tokens > 5 and 4), so the
    // decode steps must mask keys the cache still holds.
    for (std::string name : {"llama_gqa", "qwen2_bias_mqa", "qwen3_qknorm", "mistral_window", "qwen2_window", "gemma3_interleaved",
                             "gemma2_alternating", "smollm3_nope", "phi3_partial", "olmo2_postnorm"}) {
        const std::string dir = std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name;
        HfModelFolder f = load_hf_model_folder(dir);
        SafetensorsContents e = load_safetensors(dir + "/expected.safetensors");
        Transformer model(f.config, f.weights, ModelOptions{});
        std::vector<int64_t> p64 = e.tensors.at("greedy.prompt").to_i64_vector();
        std::vector<int64_t> want = e.tensors.at("greedy.tokens").to_i64_vector();
        std::vector<double> margin = e.tensors.at("greedy.margins").to_f64_vector();
        std::vector<int32_t> prompt(p64.begin(), p64.end());
        // A vocabulary-only tokenizer stand-in: the fixture models have no tokenizer and no
        // EOS inside their 97 tokens, so the byte tokenizer's EOS (257) never fires.
        auto tok = make_byte_tokenizer();
        GenerateConfig g;
        g.max_new_tokens = int64_t(want.size());
        g.temperature = 0;
        // The reference sets the context width to 64 (the training length): match it.
        model.set_context_width(std::stoll(e.metadata.at("context_width")));
        GenerationResult r = generate(model, *tok, prompt, g, KVCacheConfig{});
        for (size_t i = 0; i < want.size(); ++i) {
            if (margin[i] < 1e-4) break;  // a near-tie: f32 may legitimately pick the other token
            ASSERT_EQ(r.tokens[i], int32_t(want[i])) << name << " step " << i;
        }
    }
}

}  // namespace
}  // namespace kv
