// The latent cache of multi-head latent attention (LatentAttention::Cache::LATENT, DeepSeek-V2's
// absorbed inference): the layer's attention through a cache of [k_pe ; c_kv] per token equals
// a float64 expanded computation written here from transformers' DeepseekV2Attention (checkpoint
// layout, interleaved RoPE, per-head k_nope and v decompressed from the latent), through a
// prefill, chunks and decode steps; the cache, the memory preflight and the budget count
// (kv_lora_rank + qk_rope_head_dim) x bytes x layers per token; decoding token by token equals
// the expanded model's one pass; what the latent form does not run is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/model/latent_attention.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/run_config.h"
#include "engine/run/run_memory.h"
#include "formats/io/hf_folder.h"

namespace kv {
namespace {

std::string fixture_dir(const std::string& name) { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures/models/" + name; }

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Layer 0's attention output y (T, NH, v_head_dim) for attention inputs h (T, E) at positions
// 0..T-1, causal, in float64 from the checkpoint's tensors.
std::vector<double> naive_expanded(const ModelConfig& c, const TensorMap& w, const std::vector<double>& h, int64_t T) {
    const LatentAttention& a = c.latent;
    const int64_t E = c.hidden_size, NH = c.num_heads, D = a.qk_nope_head_dim, R = a.qk_rope_head_dim, VD = a.v_head_dim,
                  r = a.kv_lora_rank, HQ = D + R;
    auto W = [&](const std::string& n) { return w.at("model.layers.0.self_attn." + n).to_f64_vector(); };
    // y (T, out) = x (T, in) W^T
    auto lin = [&](const std::vector<double>& x, const std::vector<double>& m, int64_t in, int64_t out) {
        std::vector<double> y(size_t(T * out), 0.0);
        for (int64_t t = 0; t < T; ++t)
            for (int64_t o = 0; o < out; ++o)
                for (int64_t i = 0; i < in; ++i) y[size_t(t * out + o)] += x[size_t(t * in + i)] * m[size_t(o * in + i)];
        return y;
    };
    auto rmsnorm = [&](std::vector<double> x, const std::vector<double>& g, int64_t n, int64_t stride) {
        std::vector<double> y(size_t(T * n));
        for (int64_t t = 0; t < T; ++t) {
            double ss = 0;
            for (int64_t i = 0; i < n; ++i) ss += x[size_t(t * stride + i)] * x[size_t(t * stride + i)];
            const double inv = 1.0 / std::sqrt(ss / double(n) + a.latent_norm_eps);
            for (int64_t i = 0; i < n; ++i) y[size_t(t * n + i)] = x[size_t(t * stride + i)] * inv * g[size_t(i)];
        }
        return y;
    };
    // transformers' apply_rotary_emb: channel pairs (2i, 2i + 1) turn as one complex number by
    // t * theta^(-2i / R).
    auto rotate = [&](double* x, int64_t t) {
        for (int64_t i = 0; i < R / 2; ++i) {
            const double ang = double(t) * std::pow(c.rope_theta, -2.0 * double(i) / double(R));
            const double x0 = x[2 * i], x1 = x[2 * i + 1];
            x[2 * i] = x0 * std::cos(ang) - x1 * std::sin(ang);
            x[2 * i + 1] = x0 * std::sin(ang) + x1 * std::cos(ang);
        }
    };
    std::vector<double> q;
    if (a.q_lora_rank > 0)
        q = lin(rmsnorm(lin(h, W("q_a_proj.weight"), E, a.q_lora_rank), W("q_a_layernorm.weight"), a.q_lora_rank, a.q_lora_rank),
                W("q_b_proj.weight"), a.q_lora_rank, NH * HQ);
    else
        q = lin(h, W("q_proj.weight"), E, NH * HQ);
    std::vector<double> ckv = lin(h, W("kv_a_proj_with_mqa.weight"), E, r + R);
    const std::vector<double> lat = rmsnorm(ckv, W("kv_a_layernorm.weight"), r, r + R);
    const std::vector<double> kv = lin(lat, W("kv_b_proj.weight"), r, NH * (D + VD));
    for (int64_t t = 0; t < T; ++t) {
        rotate(&ckv[size_t(t * (r + R) + r)], t);
        for (int64_t hh = 0; hh < NH; ++hh) rotate(&q[size_t(t * NH * HQ + hh * HQ + D)], t);
    }
    const double scale = 1.0 / std::sqrt(double(HQ));
    std::vector<double> y(size_t(T * NH * VD), 0.0);
    for (int64_t hh = 0; hh < NH; ++hh)
        for (int64_t i = 0; i < T; ++i) {
            const double* qi = &q[size_t(i * NH * HQ + hh * HQ)];
            std::vector<double> s(size_t(i + 1));
            double m = -INFINITY;
            for (int64_t j = 0; j <= i; ++j) {
                const double* kn = &kv[size_t(j * NH * (D + VD) + hh * (D + VD))];
                const double* kp = &ckv[size_t(j * (r + R) + r)];
                double dot = 0;
                for (int64_t d = 0; d < D; ++d) dot += qi[d] * kn[d];
                for (int64_t d = 0; d < R; ++d) dot += qi[D + d] * kp[d];
                s[size_t(j)] = dot * scale;
                m = std::max(m, s[size_t(j)]);
            }
            double den = 0;
            for (int64_t j = 0; j <= i; ++j) den += std::exp(s[size_t(j)] - m);
            for (int64_t j = 0; j <= i; ++j) {
                const double p = std::exp(s[size_t(j)] - m) / den;
                const double* v = &kv[size_t(j * NH * (D + VD) + hh * (D + VD) + D)];
                for (int64_t d = 0; d < VD; ++d) y[size_t((i * NH + hh) * VD + d)] += p * v[d];
            }
        }
    return y;
}

// latent_attend of layer 0 through a dense latent cache, in a prefill of 5, a chunk of 4 and
// three single tokens, against naive_expanded over the same inputs.
void check_against_expanded_f64(const std::string& fixture, DType dt, double tol) {
    SCOPED_TRACE(str(fixture, dt == DType::F64 ? " f64" : " f32"));
    const HfModelFolder mf = load_hf_model_folder(fixture_dir(fixture));
    ModelOptions opt;
    opt.dtype = dt;
    opt.mla_cache = LatentAttention::Cache::LATENT;
    Transformer model(mf.config, mf.weights, opt);
    model.set_context_width(64);
    const ModelConfig& c = model.config();
    const int64_t T = 12, E = c.hidden_size, NH = c.num_heads, HS = c.head_dim, VD = c.latent.v_head_dim;
    std::mt19937_64 rng(17);
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> h(size_t(T * E));
    for (double& x : h) x = nd(rng);
    const std::vector<double> want = naive_expanded(c, mf.weights, h, T);
    const Tensor ht = Tensor::from_f64({1, T, E}, h, dt);
    KVCacheConfig kc;
    kc.name = "dense-default";
    KVCache cache(kc, c, Device{}, dt, T);
    EXPECT_EQ(cache.layer(0).policy().groups(), 1);
    double err = 0, ref = 0;
    int64_t padding = 0;
    for (int64_t s : {int64_t(0), int64_t(5), int64_t(9), int64_t(10), int64_t(11)}) {
        const int64_t e = s == 0 ? 5 : s == 5 ? 9 : s + 1;
        Tensor y = Tensor::empty({1, e - s, NH, HS}, dt);
        latent_attend(c, model.layer(0), ht.slice(1, s, e).contiguous(), model.rope(0), s, dt, cache, model.rope(0).attn_scale, 0, y, 0);
        const std::vector<double> got = y.to_f64_vector();
        for (int64_t t = s; t < e; ++t)
            for (int64_t hh = 0; hh < NH; ++hh)
                for (int64_t d = 0; d < HS; ++d) {
                    const double g = got[size_t(((t - s) * NH + hh) * HS + d)];
                    if (d >= VD) {
                        padding += g != 0.0;
                        continue;
                    }
                    const double x = want[size_t((t * NH + hh) * VD + d)];
                    err = std::max(err, std::fabs(g - x)), ref = std::max(ref, std::fabs(x));
                }
    }
    EXPECT_EQ(padding, 0);
    EXPECT_GT(ref, 0.0);
    EXPECT_LE(err, tol * ref) << "max |latent - expanded f64| " << err << " of max |y| " << ref;
    // The cache holds one vector of qk_rope_head_dim + kv_lora_rank per token.
    auto [K, V] = cache.layer(0).buffer().read(T);
    EXPECT_EQ(K.shape(), (Shape{1, 1, T, c.latent.qk_rope_head_dim + c.latent.kv_lora_rank}));
    EXPECT_EQ(K.data_ptr(), V.data_ptr());
}

TEST(LatentCache, AttentionEqualsTheExpandedFormInF64) {
    for (const char* fixture : {"deepseek_v2_mla", "deepseek_v2_lite_mla"}) {
        // f64 agrees to ~3e-8 of max |y|: the model's RoPE tables hold float cos/sin.
        check_against_expanded_f64(fixture, DType::F64, 1e-7);
        check_against_expanded_f64(fixture, DType::F32, 1e-5);
    }
}

// Per token: (kv_lora_rank + qk_rope_head_dim) x bytes x layers, in the buffers, in the kept
// (logical) bytes, in the memory preflight and in a byte budget.
TEST(LatentCache, BytesPerTokenAreTheLatentAndKpe) {
    const ModelConfig c = preset_config("tiny-mla");
    ASSERT_TRUE(c.latent_cache());
    const int64_t per_token_layer = (c.latent.kv_lora_rank + c.latent.qk_rope_head_dim) * 4;  // f32
    const int64_t per_token = per_token_layer * c.num_layers;
    EXPECT_EQ(per_token, 640);  // (32 + 8) x 4 bytes x 4 layers
    Transformer model(c, random_weights(c, 5, DType::F32, Device{}), ModelOptions{});
    model.set_context_width(128);
    const int64_t T = 96, L = 64;
    KVCacheConfig kc;
    kc.name = "h2o-default";
    kc.cache_length = L;
    KVCache cache(kc, c, Device{}, DType::F32, T);
    std::vector<int32_t> tok(static_cast<size_t>(T));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 31 + 5) % 256);
    const Tensor ids = Tensor::from_i32({1, T}, tok);
    for (int64_t s = 0; s < T; s += 16) model.forward(ids.slice(1, s, s + 16).contiguous(), s, &cache);
    EXPECT_EQ(int64_t(cache.buffer_bytes()), L * per_token);
    EXPECT_EQ(int64_t(cache.logical_bytes()), L * per_token);  // 96 tokens, 64 kept
    // the expanded form's K and V of every head
    ModelConfig e = c;
    e.latent.cache = LatentAttention::Cache::EXPANDED;
    RunConfig rc;
    rc.kv_cache.name = "h2o-default";
    rc.kv_cache.cache_length = L;
    rc.data.seq_length = T;
    rc.driver.chunk_size = 16;
    auto kv_item = [&](const ModelConfig& m) {
        for (const SizedItem& it : run_memory_items(rc, m))
            if (it.what == "KV") return int64_t(it.bytes);
        return int64_t(-1);
    };
    EXPECT_EQ(kv_item(c), L * per_token);
    EXPECT_EQ(kv_item(e), L * c.num_layers * 2 * c.num_heads * c.head_dim * 4);
    // A budget of 100 tokens' latents holds 100 slots.
    KVCacheConfig b;
    b.name = "h2o-default";
    b.budget_bytes = 100 * per_token + per_token - 1;
    KVCache budgeted(b, c, Device{}, DType::F32, T);
    EXPECT_EQ(budgeted.config().cache_length, 100);
}

// Decoding token by token through the latent cache gives the expanded model's logits of one
// pass over the whole sequence.
TEST(LatentCache, DecodeEqualsTheExpandedOnePass) {
    const ModelConfig c = preset_config("tiny-mla");
    const TensorMap w = random_weights(c, 9, DType::F32, Device{});
    ModelOptions lo, eo;
    lo.mla_cache = LatentAttention::Cache::LATENT;
    eo.mla_cache = LatentAttention::Cache::EXPANDED;
    Transformer latent(c, w, lo), expanded(c, w, eo);
    latent.set_context_width(64), expanded.set_context_width(64);
    const int64_t T = 40;
    std::vector<int32_t> tok(static_cast<size_t>(T));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 53 + 7) % 256);
    const Tensor ids = Tensor::from_i32({1, T}, tok);
    const std::vector<double> whole = expanded.forward(ids).to_f64_vector();
    KVCache cache(KVCacheConfig{}, latent.config(), Device{}, DType::F32, T);
    std::vector<double> stepped = latent.forward(ids.slice(1, 0, 8).contiguous(), 0, &cache).to_f64_vector();
    for (int64_t s = 8; s < T; ++s) {
        const std::vector<double> z = latent.forward(ids.slice(1, s, s + 1).contiguous(), s, &cache).to_f64_vector();
        stepped.insert(stepped.end(), z.begin(), z.end());
    }
    ASSERT_EQ(stepped.size(), whole.size());
    double err = 0, ref = 0;
    for (size_t i = 0; i < whole.size(); ++i) err = std::max(err, std::fabs(stepped[i] - whole[i])), ref = std::max(ref, std::fabs(whole[i]));
    EXPECT_LE(err, 1e-5 * ref);
}

TEST(LatentCache, RefusesWhatTheLatentFormDoesNotRunByName) {
    const ModelConfig c = preset_config("tiny-mla");
    KVCacheConfig q8;
    q8.name = "h2o-q8";
    q8.cache_length = 32;
    std::string m = error_of([&] { KVCache cache(q8, c, Device{}, DType::F32, 64); });
    EXPECT_NE(m.find("latent cache of multi-head latent attention"), std::string::npos) << m;
    EXPECT_NE(m.find("'q8'"), std::string::npos) << m;
    EXPECT_NE(m.find("expected such a buffer or --model.mla_cache expanded"), std::string::npos) << m;
    KVCacheConfig paged;
    paged.name = "h2o-default";
    paged.cache_length = 32;
    paged.paged_block_size = 16;
    m = error_of([&] { KVCache cache(paged, c, Device{}, DType::F32, 64); });
    EXPECT_NE(m.find("paged"), std::string::npos) << m;
    // critical-ada weighs values by W_o; ada-snapkv (the same wrapper over snapkv) does not
    KVCacheConfig crit;
    crit.name = "critical-ada-default";
    crit.cache_length = 32;
    m = error_of([&] { KVCache cache(crit, c, Device{}, DType::F32, 64); });
    EXPECT_NE(m.find("policy 'critical-ada' weighs values by the output projection W_o"), std::string::npos) << m;
    KVCacheConfig ada = crit;
    ada.name = "ada-snapkv-default";
    EXPECT_EQ(error_of([&] { KVCache cache(ada, c, Device{}, DType::F32, 64); }), "");
    // the expanded form takes them
    ModelConfig e = c;
    e.latent.cache = LatentAttention::Cache::EXPANDED;
    EXPECT_EQ(error_of([&] { KVCache cache(q8, e, Device{}, DType::F32, 64); }), "");
    // training: gradients run through the expanded form
    RunConfig rc;
    rc.mode = "finetune_long_lora";
    rc.mla_cache = "latent";
    m = error_of([&] { mla_cache_choice(rc); });
    EXPECT_NE(m.find("--model.mla_cache latent: finetune_long_lora computes gradients"), std::string::npos) << m;
    rc.mla_cache = "auto";
    EXPECT_EQ(mla_cache_choice(rc), LatentAttention::Cache::EXPANDED);
    rc.mode = "eval_long";
    EXPECT_EQ(mla_cache_choice(rc), LatentAttention::Cache::LATENT);
    rc.mla_cache = "expanded";
    EXPECT_EQ(mla_cache_choice(rc), LatentAttention::Cache::EXPANDED);
}

}  // namespace
}  // namespace kv
