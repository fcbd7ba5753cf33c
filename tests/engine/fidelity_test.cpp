// Fidelity against the dense cache (engine/driver/fidelity.h): with the dense cache, or a cache
// that holds the whole sequence, the attention error is 0 and the kept mass 1 exactly; with an
// evicting policy every (layer, chunk) number equals an f64 recomputation from the replay log
// (which positions each row held) and the K/V that went in.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <tuple>

#include "engine/driver/fidelity.h"
#include "engine/driver/long_context.h"
#include "engine/kv/replay_log.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/run/evaluate.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

struct ModelRun {
    std::vector<FidelityStep> steps;
    std::vector<FidelityKLStep> kl;
    ChunkPlan plan;
    std::vector<float> policy_logits;  // (T, V): the policy run's own final outputs through the head
    std::vector<int32_t> ids;
    int64_t exact_prefix = 0;  // chunks the policy's stream shared with dense
};

// share: the dense reference takes the policy's exact prefix from its FidelityAttention (as
// evaluate does) instead of recomputing it.
ModelRun run_model_full(const std::string& name, int64_t L, int64_t T, int64_t chunk, bool share = true, int64_t kl_positions = 0,
                        int64_t dense_block = 0) {
    const ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
    KVCacheConfig kc;
    kc.name = name;
    kc.cache_length = L;
    kc.max_chunk_size = chunk;
    KVCache cache(kc, cfg, Device{}, DType::F32, T);
    FidelityAttention fid(cache, cfg, 1, T, Device{}, DType::F32);
    std::mt19937_64 rng(11);
    std::vector<int32_t> v((size_t)T);
    for (auto& x : v) x = int32_t(rng() % 256);
    Tensor ids = Tensor::from_i32({1, T}, v);
    // Chunks of `chunk` from position 0 (plan_chunks would prefill a cache of L >= T in one
    // chunk, which leaves nothing but the prefill to compare).
    ChunkPlan plan;
    for (int64_t p = 0; p < T; p += chunk) {
        plan.starts.push_back(p);
        plan.chunks.push_back(std::min(chunk, T - p));
    }
    plan.cells = group_cells(plan.chunks, 1 << 30);
    HeadSpec hs;
    hs.kind = HeadKind::NEXT_TOKEN;
    hs.B = 1;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    DriverCallbacks cb;
    cb.attention = &fid;
    DenseReference dense(model, 1, T, share ? &fid : nullptr, kl_positions);
    if (dense_block > 0) dense.set_block_tokens(dense_block);
    ModelRun out;
    cb.final_output = [&](size_t cell, const std::vector<Tensor>& xs) {
        dense.run_cell(ids, plan, cell, xs);
        for (const Tensor& x : xs) {
            const std::vector<float> z = model.lm_head(model.final_norm(x)).to_f32_vector();
            out.policy_logits.insert(out.policy_logits.end(), z.begin(), z.end());
        }
    };
    long_context_forward(model, cache, ids, plan, hs, res, cb);
    EXPECT_EQ(int64_t(fid.steps().size()), int64_t(plan.chunks.size()) * cfg.num_layers);
    EXPECT_EQ(dense.steps().size(), plan.chunks.size());
    EXPECT_GT(plan.chunks.size(), 4u);
    out.steps = fid.steps();
    out.kl = dense.steps();
    for (size_t c = 0; c < plan.chunks.size(); ++c) out.exact_prefix += fid.prefix_exact(int64_t(c)) ? 1 : 0;
    out.plan = plan;
    out.ids = v;
    return out;
}

std::vector<FidelityStep> run_model(const std::string& name, int64_t L, int64_t T, int64_t chunk) { return run_model_full(name, L, T, chunk).steps; }

TEST(Fidelity, DenseCacheIsExact) {
    const auto steps = run_model("dense-default", 0, 96, 16);
    ASSERT_FALSE(steps.empty());
    for (const FidelityStep& s : steps) {
        EXPECT_EQ(s.attn_rel_error, 0.0) << "layer " << s.layer << " chunk " << s.chunk;
        EXPECT_EQ(s.kept_mass, 1.0) << "layer " << s.layer << " chunk " << s.chunk;
    }
}

TEST(Fidelity, CacheHoldingTheSequenceIsExact) {
    for (const std::string name : {"h2o-default", "lastrec-default"}) {
        const auto steps = run_model(name, 128, 96, 16);
        ASSERT_FALSE(steps.empty());
        for (const FidelityStep& s : steps) {
            EXPECT_EQ(s.attn_rel_error, 0.0) << name << " layer " << s.layer << " chunk " << s.chunk;
            EXPECT_EQ(s.kept_mass, 1.0) << name << " layer " << s.layer << " chunk " << s.chunk;
        }
    }
}

TEST(Fidelity, EvictingCacheLosesSomething) {
    // A cache of 32 slots on 96 tokens must drop attention mass in some step (a property, not a
    // number: the f64 test below checks the values).
    const auto steps = run_model("lastrec-default", 32, 96, 16);
    double min_mass = 1, max_err = 0;
    for (const FidelityStep& s : steps) min_mass = std::min(min_mass, s.kept_mass), max_err = std::max(max_err, s.attn_rel_error);
    EXPECT_LT(min_mass, 1.0);
    EXPECT_GT(max_err, 0.0);
}

// f64 attention of one query row over the positions in `keep` (all positions <= p when empty).
struct RefAttention {
    const std::vector<double>& k;  // (B, G, T, D)
    const std::vector<double>& v;
    int64_t G, T, D;
    void row(const double* q, int64_t b, int64_t g, int64_t p, const std::vector<char>* keep, double scale, double* y, double* w) const {
        std::vector<double> s((size_t)(p + 1), -INFINITY);
        double m = -INFINITY;
        for (int64_t t = 0; t <= p; ++t) {
            if (keep && !(*keep)[size_t(t)]) continue;
            double d = 0;
            for (int64_t i = 0; i < D; ++i) d += q[i] * k[size_t(((b * G + g) * T + t) * D + i)];
            s[size_t(t)] = d * scale;
            m = std::max(m, s[size_t(t)]);
        }
        double z = 0;
        for (int64_t t = 0; t <= p; ++t) z += std::isinf(s[size_t(t)]) ? 0.0 : std::exp(s[size_t(t)] - m);
        for (int64_t i = 0; i < D; ++i) y[i] = 0;
        for (int64_t t = 0; t <= p; ++t) {
            const double a = std::isinf(s[size_t(t)]) ? 0.0 : std::exp(s[size_t(t)] - m) / z;
            if (w) w[t] = a;
            for (int64_t i = 0; i < D; ++i) y[i] += a * v[size_t(((b * G + g) * T + t) * D + i)];
        }
    }
};

TEST(Fidelity, EqualsF64RecomputationFromReplayLog) {
    const int64_t B = 2, G = 2, NH = 4, D = 16, L = 24, T = 72, n = 8;
    // Both ways to full attention: merged from the policy's own (merge, the default for raw
    // f32 storage) and recomputed over the shadow.
    for (const auto& [name, merge] : std::vector<std::pair<std::string, bool>>{
             {"h2o-default", true}, {"lastrec-default", true}, {"tova-default", true}, {"h2o-default", false}, {"tova-default", false}}) {
        SCOPED_TRACE(name + (merge ? ", merged" : ", full attention"));
        ModelConfig mc;
        mc.vocab_size = 16;
        mc.hidden_size = NH * D;
        mc.intermediate_size = 8;
        mc.num_layers = 1;
        mc.num_heads = NH;
        mc.num_kv_heads = G;
        mc.head_dim = D;
        mc.max_position_embeddings = 4096;
        KVCacheConfig kc;
        kc.name = name;
        kc.cache_length = L;
        kc.max_chunk_size = n;
        KVCache cache(kc, mc, Device{}, DType::F32, 0);
        cache.set_replay_logging(true);
        FidelityAttention fid(cache, mc, B, T, Device{}, DType::F32);
        fid.set_merge(merge);
        std::mt19937_64 rng(7);
        std::vector<double> K((size_t)(B * G * T * D)), V(K.size());
        std::vector<std::vector<double>> Q;
        const double scale = 1.0 / std::sqrt(double(D));
        for (int64_t p0 = 0; p0 < T; p0 += n) {
            Tensor q = random_tensor({B, NH, n, D}, DType::F32, rng, -2.0, 2.0);
            Tensor k = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
            Tensor v = random_tensor({B, G, n, D}, DType::F32, rng, -2.0, 2.0);
            const auto kv_ = k.to_f64_vector(), vv = v.to_f64_vector();
            for (int64_t r = 0; r < B * G; ++r)
                for (int64_t t = 0; t < n; ++t)
                    for (int64_t i = 0; i < D; ++i) {
                        K[size_t((r * T + p0 + t) * D + i)] = kv_[size_t((r * n + t) * D + i)];
                        V[size_t((r * T + p0 + t) * D + i)] = vv[size_t((r * n + t) * D + i)];
                    }
            Q.push_back(q.to_f64_vector());
            Tensor y = Tensor::empty({B, NH, n, D}, DType::F32);
            fid.attend(0, q, k, v, p0, float(scale), 0, y);
        }
        const auto& plans = cache.layer(0).replay_log().plans();
        const auto& steps = fid.steps();
        ASSERT_EQ(steps.size(), plans.size());
        RefAttention ref{K, V, G, T, D};
        bool evicted = false;
        for (size_t c = 0; c < steps.size(); ++c) {
            const int64_t p0 = int64_t(c) * n, end = p0 + n;
            int64_t rows = 1;
            const std::vector<int32_t> slots = replay_positions(plans, c + 1, L, &rows);
            double num = 0, den = 0, mass = 0;
            for (int64_t b = 0; b < B; ++b)
                for (int64_t h = 0; h < NH; ++h) {
                    const int64_t g = h / (NH / G), r = rows == 1 ? 0 : b * G + g;
                    std::vector<char> keep((size_t)end, 0);
                    for (int64_t s = 0; s < L; ++s)
                        if (int32_t p = slots[size_t(r * L + s)]; p >= 0 && p < end) keep[size_t(p)] = 1;
                    for (int64_t t = 0; t < end; ++t) evicted = evicted || !keep[size_t(t)];
                    for (int64_t i = 0; i < n; ++i) {
                        const double* q = &Q[c][size_t(((b * NH + h) * n + i) * D)];
                        std::vector<double> yf((size_t)D), yp((size_t)D), w((size_t)end, 0.0);
                        ref.row(q, b, g, p0 + i, nullptr, scale, yf.data(), w.data());
                        ref.row(q, b, g, p0 + i, &keep, scale, yp.data(), nullptr);
                        for (int64_t d = 0; d < D; ++d) num += (yp[size_t(d)] - yf[size_t(d)]) * (yp[size_t(d)] - yf[size_t(d)]), den += yf[size_t(d)] * yf[size_t(d)];
                        for (int64_t t = 0; t < end; ++t) mass += keep[size_t(t)] ? w[size_t(t)] : 0.0;
                    }
                }
            const double err_ref = std::sqrt(num / den), mass_ref = mass / double(B * NH * n);
            EXPECT_EQ(steps[c].chunk, int64_t(c));
            EXPECT_EQ(steps[c].input_pos, p0);
            // f32 attention in the engine against f64 here.
            EXPECT_NEAR(steps[c].attn_rel_error, err_ref, 1e-5 + 1e-4 * err_ref) << "chunk " << c;
            EXPECT_NEAR(steps[c].kept_mass, mass_ref, 2e-6) << "chunk " << c;
        }
        EXPECT_TRUE(evicted) << "the case must evict to test anything";
        if (merge) EXPECT_GT(fid.merged_steps(), 0) << "the merge path must have run";
        else EXPECT_EQ(fid.merged_steps(), 0);
    }
}

TEST(Fidelity, NextTokenKLIsZeroForDenseAndForACacheHoldingTheSequence) {
    for (const auto& [name, L] : std::vector<std::pair<std::string, int64_t>>{{"dense-default", 0}, {"h2o-default", 128}, {"lastrec-default", 128}}) {
        const ModelRun r = run_model_full(name, L, 96, 16);
        ASSERT_EQ(r.kl.size(), r.plan.chunks.size()) << name;
        for (const FidelityKLStep& k : r.kl) EXPECT_EQ(k.next_token_kl, 0.0) << name << " chunk " << k.chunk;
    }
}

// f64 log-softmax of one row of logits.
std::vector<double> log_softmax64(const float* z, int64_t V) {
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, double(z[i]));
    for (int64_t i = 0; i < V; ++i) s += std::exp(double(z[i]) - m);
    std::vector<double> out((size_t)V);
    for (int64_t i = 0; i < V; ++i) out[size_t(i)] = double(z[i]) - m - std::log(s);
    return out;
}

TEST(Fidelity, NextTokenKLEqualsF64RecomputationAgainstAPlainForward) {
    // The dense side recomputed independently: one whole-sequence forward with no cache and no
    // chunks (PlainAttention), against the policy run's own logits; the KL in f64 here.
    // Both ways of running the dense stream: with the policy's exact prefix shared (the first
    // two chunks: lastrec holds 32 positions) and recomputed; and the KL over 5 of each chunk's
    // 16 positions (--fidelity_kl_positions: (i + 1) n / 5 - 1, i < 5); and the dense stream
    // in prefills of 40 tokens (whole chunks: 32), so blocks start past the prefix.
    const int64_t T = 96;
    for (const auto& [share, N, block] : std::vector<std::tuple<bool, int64_t, int64_t>>{{true, 0, 0}, {false, 0, 0}, {true, 5, 0}, {true, 0, 40}, {false, 5, 40}}) {
        SCOPED_TRACE(str(share ? "exact prefix shared" : "dense stream recomputed", ", KL positions ", N, ", dense block ", block));
        const ModelRun r = run_model_full("lastrec-default", 32, T, 16, share, N, block);
        EXPECT_EQ(r.exact_prefix, 2) << "lastrec with 32 slots and chunks of 16 drops nothing in the first two chunks";
        const ModelConfig cfg = preset_config("tiny");
        Transformer model{cfg, random_weights(cfg, 5, DType::F32), ModelOptions{}};
        model.set_context_width(T);
        const std::vector<float> dense = model.forward(Tensor::from_i32({1, T}, r.ids)).to_f32_vector();
        const int64_t V = cfg.vocab_size;
        ASSERT_EQ(int64_t(dense.size()), T * V);
        ASSERT_EQ(int64_t(r.policy_logits.size()), T * V);
        double max_kl = 0;
        for (const FidelityKLStep& k : r.kl) {
            double ref = 0;
            std::vector<int64_t> at;
            for (int64_t i = 0; i < (N > 0 ? N : k.n); ++i) at.push_back(N > 0 ? k.input_pos + (i + 1) * k.n / N - 1 : k.input_pos + i);
            for (int64_t t : at) {
                const std::vector<double> lp = log_softmax64(&dense[size_t(t * V)], V), lq = log_softmax64(&r.policy_logits[size_t(t * V)], V);
                for (int64_t i = 0; i < V; ++i) ref += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
            }
            ref /= double(at.size());
            // f32 chunked vs whole-sequence forwards differ by rounding only.
            EXPECT_NEAR(k.next_token_kl, ref, 1e-6 + 2e-3 * ref) << "chunk " << k.chunk;
            max_kl = std::max(max_kl, ref);
        }
        EXPECT_GT(max_kl, 1e-4) << "the case must evict something that changes the output to test anything";
    }
}

TEST(Fidelity, KLOfLogitsMatchesClosedForm) {
    // p = (1/4, 3/4), q = (1/2, 1/2): KL = 1/4 ln(1/2) + 3/4 ln(3/2). Logits shifted per row
    // (softmax is shift-invariant), and a second row with p = q.
    const std::vector<float> p = {5.0f, 5.0f + float(std::log(3.0)), 1.0f, 2.0f};
    const std::vector<float> q = {-7.0f, -7.0f, 11.0f, 12.0f};
    const double want = (0.25 * std::log(0.5) + 0.75 * std::log(1.5)) / 2.0;
    EXPECT_NEAR(mean_kl_of_logits(p, q, 2, 2), want, 1e-7);
    EXPECT_EQ(mean_kl_of_logits(p, p, 2, 2), 0.0);
}

TEST(Fidelity, ShadowOutsideItsSizeIsRefused) {
    ModelConfig mc = preset_config("tiny");
    KVCacheConfig kc;
    kc.name = "dense-default";
    KVCache cache(kc, mc, Device{}, DType::F32, 64);
    FidelityAttention fid(cache, mc, 1, 8, Device{}, DType::F32);
    std::mt19937_64 rng(1);
    Tensor q = random_tensor({1, mc.num_heads, 16, mc.head_dim}, DType::F32, rng);
    Tensor k = random_tensor({1, mc.num_kv_heads, 16, mc.head_dim}, DType::F32, rng);
    Tensor y = Tensor::empty(q.shape(), DType::F32);
    try {
        fid.attend(0, q, k, k, 0, 0.125f, 0, y);
        FAIL() << "a chunk past the shadow must be refused";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside the shadow sized for"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::test
