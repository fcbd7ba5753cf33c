// The latent cache of multi-head latent attention (LatentAttention::Cache::LATENT, DeepSeek-V2's
// absorbed inference): the layer's attention through a cache of [k_pe ; c_kv] per token equals
// a float64 expanded computation written here from transformers' DeepseekV2Attention (checkpoint
// layout, interleaved RoPE, per-head k_nope and v decompressed from the latent), through a
// prefill, chunks and decode steps; the cache, the memory preflight and the budget count
// (kv_lora_rank + qk_rope_head_dim) x bytes x layers per token; decoding token by token equals
// the expanded model's one pass; what the latent form does not run is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
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

// latent_attend of layer 0 through a dense latent cache, in chunks starting at `starts` (a
// prefill of 5, a chunk of 4 and three single tokens unless given), against naive_expanded over
// the same inputs; `form` picks the absorbed or expanded computation of the chunks.
void check_against_expanded_f64(const std::string& fixture, DType dt, double tol,
                                LatentAttention::ChunkForm form = LatentAttention::ChunkForm::AUTO,
                                std::vector<int64_t> starts = {0, 5, 9, 10, 11}, int64_t T = 12) {
    SCOPED_TRACE(str(fixture, dt == DType::F64 ? " f64" : " f32", " form ", int(form), " chunks from ", starts.size() > 1 ? starts[1] : T));
    const HfModelFolder mf = load_hf_model_folder(fixture_dir(fixture));
    ModelOptions opt;
    opt.dtype = dt;
    opt.mla_cache = LatentAttention::Cache::LATENT;
    ModelConfig mc = mf.config;
    mc.latent.chunk_form = form;
    Transformer model(mc, mf.weights, opt);
    model.set_context_width(64);
    const ModelConfig& c = model.config();
    const int64_t E = c.hidden_size, NH = c.num_heads, HS = c.head_dim, VD = c.latent.v_head_dim;
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
    for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t s = starts[i], e = i + 1 < starts.size() ? starts[i + 1] : T;
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

// Chunks of 1, 7 and 32 queries and one chunk of the whole 40, each computed absorbed, expanded
// and by the work counts' choice (latent_expansion.h), equal the f64 expanded attention: the
// expanded form decompresses the latents the cache holds, which are all it stores.
TEST(LatentCache, ChunksInEitherFormEqualTheExpandedF64) {
    const int64_t T = 40;
    for (const int64_t chunk : {int64_t(1), int64_t(7), int64_t(32), T}) {
        std::vector<int64_t> starts;
        for (int64_t s = 0; s < T; s += chunk) starts.push_back(s);
        for (const auto form : {LatentAttention::ChunkForm::AUTO, LatentAttention::ChunkForm::ABSORBED, LatentAttention::ChunkForm::EXPANDED})
            for (const char* fixture : {"deepseek_v2_mla", "deepseek_v2_lite_mla"}) {
                check_against_expanded_f64(fixture, DType::F64, 1e-7, form, starts, T);
                check_against_expanded_f64(fixture, DType::F32, 1e-5, form, starts, T);
            }
    }
}

// The crossover: the smallest n for which decompressing T latents (T r NH (D + VD)) plus the
// expanded attention (n T NH (HS + VD)) costs fewer multiply-adds than the absorbed attention
// (n T NH 2C), counted here for T = 1000 by trying every n; decode stays absorbed.
TEST(LatentCache, ExpandsFromTheChunkSizeWhereItCostsLess) {
    for (const char* name : {"tiny-mla", "deepseek_v2_mla", "deepseek_v2_lite_mla"}) {
        SCOPED_TRACE(name);
        ModelConfig c = std::string(name) == "tiny-mla" ? preset_config(name) : load_hf_model_folder(fixture_dir(name)).config;
        const LatentAttention& a = c.latent;
        const double T = 1000, NH = double(c.num_heads), r = double(a.kv_lora_rank), D = double(a.qk_nope_head_dim),
                     VD = double(a.v_head_dim), HS = double(c.head_dim), C = double(a.qk_rope_head_dim + a.kv_lora_rank);
        int64_t first = -1;
        for (int64_t n = 1; n < 100000 && first < 0; ++n)
            if (T * r * NH * (D + VD) + double(n) * T * NH * (HS + VD) < double(n) * T * NH * 2 * C) first = n;
        EXPECT_GT(first, 1);
        EXPECT_EQ(latent_expand_min_queries(c), first);
        c.latent.chunk_form = LatentAttention::ChunkForm::EXPANDED;
        EXPECT_EQ(latent_expand_min_queries(c), 0);
        c.latent.chunk_form = LatentAttention::ChunkForm::ABSORBED;
        EXPECT_EQ(latent_expand_min_queries(c), -1);
    }
    // DeepSeek-V2-Lite's shapes (r 512, R 64, qk 192, v 128): r (D + VD) / (2C - HS - VD) = 131072 / 832
    ModelConfig lite = preset_config("tiny-mla");
    lite.latent.kv_lora_rank = 512, lite.latent.qk_rope_head_dim = 64, lite.latent.qk_nope_head_dim = 128, lite.latent.v_head_dim = 128;
    lite.head_dim = 192;
    EXPECT_EQ(latent_expand_min_queries(lite), 158);
}

// Eviction decided on the same attention-weight sums (or queries): h2o, snapkv and
// expected-attention over 112 tokens through 40
// slots, a prefill of 40, chunks of 32 and 8 decode steps, keep the same slots after every call whether the
// chunks run absorbed or expanded (the expanded per-head sums averaged over the one latent
// group's heads, as ops::sdpa_ averages a group: the sums themselves agree within 1e-5), and
// give the same logits.
TEST(LatentCache, ExpandedAndAbsorbedChunksKeepTheSameSlots) {
    const ModelConfig c = preset_config("tiny-mla");
    TensorMap w = random_weights(c, 11, DType::F32, Device{});
    // Random weights attend almost uniformly (pooled votes within 0.2% of each other), so the
    // two forms' 1e-6 rounding differences would reorder near-ties between AVX2 and AVX-512
    // kernels; queries 6x longer spread the scores well beyond that.
    for (int l = 0; l < c.num_layers; ++l) {
        Tensor& q = w.at("model.layers." + std::to_string(l) + ".self_attn.q_b_proj.weight");
        std::vector<float> v = q.to_f32_vector();
        for (float& x : v) x *= 6.0f;
        q = Tensor::from_f32(q.shape(), v);
    }
    const int64_t T = 112;
    std::vector<int32_t> tok(static_cast<size_t>(T));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 71 + 3) % 256);
    const Tensor ids = Tensor::from_i32({1, T}, tok);
    // expected-attention reads the chunk's query vectors: the expanded form forms the absorbed
    // queries for it (LatentExpansion::ensure_queries), which h2o and snapkv never read.
    for (const char* policy : {"h2o-default", "snapkv-default", "expected-attention-default"}) {
        SCOPED_TRACE(policy);
        struct Run {
            std::vector<double> logits;
            std::vector<std::vector<int32_t>> kept;  // per call, every layer's slot positions
            std::vector<float> weights;               // every call's weight sums the policies read
        };
        auto run = [&](LatentAttention::ChunkForm form) {
            ModelConfig mc = c;
            mc.latent.chunk_form = form;
            Transformer model(mc, w, ModelOptions{});
            model.set_context_width(128);
            KVCacheConfig kc;
            kc.name = policy;
            kc.cache_length = 40;
            kc.snapkv_window = 8;
            KVCache cache(kc, model.config(), Device{}, DType::F32, T);
            Run out;
            cache.set_step_hook([&](const LayerStep& st) {
                if (st.weights) out.weights.insert(out.weights.end(), st.weights->begin(), st.weights->end());
            });
            for (int64_t s = 0; s < T;) {
                const int64_t n = s == 0 ? 40 : s < 104 ? 32 : 1;
                const int64_t e = std::min(T, s + n);
                const std::vector<double> z = model.forward(ids.slice(1, s, e).contiguous(), s, &cache).to_f64_vector();
                out.logits.insert(out.logits.end(), z.begin(), z.end());
                std::vector<int32_t> kept;
                for (int l = 0; l < cache.num_layers(); ++l) {
                    const KVPolicy& p = cache.layer(l).policy();
                    kept.insert(kept.end(), p.token_positions().begin(), p.token_positions().end());
                }
                out.kept.push_back(kept);
                s = e;
            }
            return out;
        };
        const Run absorbed = run(LatentAttention::ChunkForm::ABSORBED), expanded = run(LatentAttention::ChunkForm::EXPANDED);
        ASSERT_EQ(absorbed.kept.size(), expanded.kept.size());
        for (size_t i = 0; i < absorbed.kept.size(); ++i) EXPECT_EQ(absorbed.kept[i], expanded.kept[i]) << "call " << i;
        ASSERT_EQ(absorbed.logits.size(), expanded.logits.size());
        double err = 0, ref = 0;
        for (size_t i = 0; i < absorbed.logits.size(); ++i)
            err = std::max(err, std::fabs(absorbed.logits[i] - expanded.logits[i])), ref = std::max(ref, std::fabs(absorbed.logits[i]));
        EXPECT_LE(err, 1e-5 * ref);
        EXPECT_GT(err, 0.0);  // two computations ran, not one
        ASSERT_EQ(absorbed.weights.size(), expanded.weights.size());
        if (std::string(policy) != "expected-attention-default") {  // it reads none
            ASSERT_FALSE(absorbed.weights.empty());
        }
        double werr = 0, wref = 0;
        for (size_t i = 0; i < absorbed.weights.size(); ++i)
            werr = std::max(werr, double(std::fabs(absorbed.weights[i] - expanded.weights[i]))),
            wref = std::max(wref, double(std::fabs(absorbed.weights[i])));
        EXPECT_LE(werr, 1e-5 * wref);
        // it evicted: 112 tokens through 40 slots
        std::vector<int32_t> last = expanded.kept.back();
        EXPECT_EQ(std::count_if(last.begin(), last.end(), [](int32_t p) { return p >= 0; }), 40 * c.num_layers);
    }
}

// A forward without a cache (PlainAttention) stores nothing, so a model configured for a latent
// cache runs the expanded form there: the same block output as the expanded configuration, and
// the activations of the reverse pass can be kept. (Its logits against transformers' f64:
// DeepseekV2Fixture.MatchesTransformersDeepseekV2Code.)
TEST(LatentCache, ForwardWithoutACacheRunsTheExpandedForm) {
    const HfModelFolder mf = load_hf_model_folder(fixture_dir("deepseek_v2_mla"));
    ModelOptions lo, eo;
    lo.mla_cache = LatentAttention::Cache::LATENT;
    eo.mla_cache = LatentAttention::Cache::EXPANDED;
    Transformer latent(mf.config, mf.weights, lo), expanded(mf.config, mf.weights, eo);
    latent.set_context_width(64), expanded.set_context_width(64);
    ASSERT_TRUE(latent.config().latent_cache());
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd(0.0, 1.0);
    const int64_t T = 9, E = mf.config.hidden_size;
    std::vector<double> xv(size_t(T * E));
    for (double& x : xv) x = nd(rng);
    const Tensor x = Tensor::from_f64({1, T, E}, xv, DType::F32);
    PlainAttention p1, p2;
    BlockActivations save;
    const std::vector<float> got = latent.block(0, x, 0, p1, &save).to_f32_vector();
    EXPECT_EQ(got, expanded.block(0, x, 0, p2).to_f32_vector());
    EXPECT_TRUE(save.c.defined());
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
