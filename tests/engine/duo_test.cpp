// DuoAttention (policy `duo`, engine/kv/policies/policy_duo.cpp) and its calibration
// (engine/kv/duo_calibration.h): the gate file and its errors; the head selection rules;
// all-retrieval = dense and all-streaming = streaming bit for bit; mixed layers keep exactly
// sinks + recent (streaming heads) and the budget (retrieval heads), replay bit for bit, and the
// tracker counts exactly the kept slots; the mixed attention op against an f64 masked
// reference and central differences; the calibration's d loss / d alpha against central
// differences; and a model with two planted retrieval heads, which the calibration ranks first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/kv/policies/duo_gates.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "engine/kv/duo_calibration.h"
#include "grad_test_util.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
bool duo_head_is_retrieval_for_test(const KVPolicy& p, int64_t g);
int64_t duo_head_capacity_for_test(const KVPolicy& p, int64_t g);
}  // namespace kv

namespace kv::test {
namespace {

std::string error_text(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string temp_path(const std::string& name) {
    return testing::TempDir() + "duo_test_" + name;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
}

// Every layer's output for every chunk.
// replay: per layer, the plans to commit instead of the policy's (ChunkInput::replay).
std::vector<std::vector<float>> run_chunks(Transformer& m, KVCache& cache, const Tensor& ids, const std::vector<int64_t>& chunks,
                                           const std::vector<std::vector<SlotPlan>>* replay = nullptr) {
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = m.embed(ids.slice(1, P, P + n));
        ChunkCall call(cache, ChunkInput{.replay = replay});
        for (int l = 0; l < int(m.config().num_layers); ++l) {
            x = m.block(l, x, P, call);
            outs.push_back(x.to_f32_vector());
        }
        P += n;
    }
    return outs;
}

Tensor random_ids(int64_t B, int64_t T, const std::string& seed) {
    std::mt19937_64 rng(seed_for(seed));
    std::vector<int32_t> v((size_t)(B * T));
    for (auto& x : v) x = int32_t(rng() % 200 + 32);
    return Tensor::from_i32({B, T}, v);
}

// =========================================================================================
// gate file
// =========================================================================================

TEST(DuoGates, FileRoundTripsAndBadFilesGiveOneClearMessage) {
    DuoGates g;
    g.model = "tiny";
    g.layers = 2, g.kv_heads = 2, g.sink = 4, g.recent = 16;
    g.gates = {0.25, 1.0, 0.0, 0.75};
    const std::string path = temp_path("roundtrip.txt");
    write_duo_gates(path, g);
    const DuoGates r = read_duo_gates(path);
    EXPECT_EQ(r.model, "tiny");
    EXPECT_EQ(r.layers, 2);
    EXPECT_EQ(r.kv_heads, 2);
    EXPECT_EQ(r.sink, 4);
    EXPECT_EQ(r.recent, 16);
    EXPECT_EQ(r.gates, g.gates);

    EXPECT_NE(error_text([&] { read_duo_gates(temp_path("missing.txt")); }).find("cannot read"), std::string::npos);
    const std::string bad = temp_path("bad.txt");
    write_text(bad, "hello world\n");
    EXPECT_NE(error_text([&] { read_duo_gates(bad); }).find("is not a DuoAttention gate file"), std::string::npos);
    write_text(bad, "kvlab-duo-gates 2\nlayers 1\nkv_heads 1\ngates\n1\n");
    EXPECT_NE(error_text([&] { read_duo_gates(bad); }).find("version 2"), std::string::npos);
    write_text(bad, "kvlab-duo-gates 1\nlayers 2\nkv_heads 2\ngates\n0.5 0.5\n0.5\n");
    EXPECT_NE(error_text([&] { read_duo_gates(bad); }).find("is not 2 numbers in [0, 1]"), std::string::npos);
    write_text(bad, "kvlab-duo-gates 1\nlayers 1\nkv_heads 2\ngates\n0.5 1.5\n");
    EXPECT_NE(error_text([&] { read_duo_gates(bad); }).find("gate 1.5 is out of range"), std::string::npos);
    write_text(bad, "kvlab-duo-gates 1\nlayers 2\nkv_heads 2\ngates\n0.5 0.5\n");
    EXPECT_NE(error_text([&] { read_duo_gates(bad); }).find("has 1 rows of gates; expected 2"), std::string::npos);

    // Wrong model shape: the cache refuses the file, naming both shapes.
    const ModelConfig cfg = preset_config("tiny");
    DuoGates w = g;
    w.layers = 3;
    w.gates = {1, 1, 1, 1, 1, 1};
    write_duo_gates(bad, w);
    KVCacheConfig kc;
    kc.name = "duo-default";
    kc.duo_gates = bad;
    const std::string msg = error_text([&] { KVCache c(kc, cfg, Device{}, DType::F32, 64); });
    EXPECT_NE(msg.find("has gates for 3 layers x 2 KV heads"), std::string::npos) << msg;
    EXPECT_NE(msg.find("this model has 2 layers x 2 KV heads"), std::string::npos) << msg;
    kc.duo_gates = "";
    EXPECT_NE(error_text([&] { KVCache c(kc, cfg, Device{}, DType::F32, 64); }).find("--kv_cache.duo_gates is required"),
              std::string::npos);
}

TEST(DuoGates, ThresholdAndSparsitySelectTheDocumentedHeads) {
    DuoGates g;
    g.layers = 2, g.kv_heads = 2;
    g.gates = {0.9, 0.1, 0.5, 0.7};
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, -1), (std::vector<uint8_t>{1, 0, 1, 1}));  // gate >= threshold
    EXPECT_EQ(duo_retrieval_heads(g, 0.8, -1), (std::vector<uint8_t>{1, 0, 0, 0}));
    // sparsity s: the round(s * 4) lowest gates are streaming heads
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, 0.5), (std::vector<uint8_t>{1, 0, 0, 1}));
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, 0.25), (std::vector<uint8_t>{1, 0, 1, 1}));
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, 0.0), (std::vector<uint8_t>{1, 1, 1, 1}));
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, 1.0), (std::vector<uint8_t>{0, 0, 0, 0}));
    g.gates = {0.5, 0.5, 0.5, 0.5};  // ties: the earlier head stays a retrieval head
    EXPECT_EQ(duo_retrieval_heads(g, 0.5, 0.5), (std::vector<uint8_t>{1, 1, 0, 0}));
}

// =========================================================================================
// the policy
// =========================================================================================

struct Tiny {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 11, DType::F32), ModelOptions{}};
};
Tiny& tiny() {
    static Tiny t;
    return t;
}

TEST(DuoPolicy, AllRetrievalHeadsEqualDenseBitForBit) {
    Tiny& t = tiny();
    const int64_t B = 2, T = 72;
    const Tensor ids = random_ids(B, T, "duo dense");
    const std::vector<int64_t> chunks = {24, 8, 8, 8, 1, 1, 6, 16};
    KVCacheConfig dense;
    dense.name = "dense-default";
    KVCacheConfig duo = dense;
    duo.name = "duo-default";
    duo.duo_gates = "pattern:1";
    duo.policy_options = {{"duo_sinks", 4}, {"duo_recent", 8}};  // streaming heads would keep 12: none here
    KVCache a(dense, t.cfg, Device{}, DType::F32, T), b(duo, t.cfg, Device{}, DType::F32, T);
    EXPECT_EQ(run_chunks(t.model, a, ids, chunks), run_chunks(t.model, b, ids, chunks));
    EXPECT_EQ(a.buffer_bytes(), b.buffer_bytes());
}

TEST(DuoPolicy, AllStreamingHeadsEqualStreamingBitForBit) {
    Tiny& t = tiny();
    const int64_t B = 2, T = 96;
    const Tensor ids = random_ids(B, T, "duo streaming");
    const std::vector<int64_t> chunks = {16, 4, 4, 8, 12, 1, 1, 2, 12, 12, 12, 12};
    KVCacheConfig s;
    s.name = "streaming-default";
    s.cache_length = 16;
    s.sinks = 4;
    KVCacheConfig duo;
    duo.name = "duo-default";
    duo.cache_length = 40;  // the budget a retrieval head would get
    duo.duo_gates = "pattern:0";
    duo.policy_options = {{"duo_sinks", 4}, {"duo_recent", 12}};
    KVCache a(s, t.cfg, Device{}, DType::F32, T), b(duo, t.cfg, Device{}, DType::F32, T);
    EXPECT_EQ(run_chunks(t.model, a, ids, chunks), run_chunks(t.model, b, ids, chunks));
    // Storage is the 16 slots the heads keep, not the 40 of cache_length.
    EXPECT_EQ(b.buffer_bytes(), size_t(t.cfg.num_layers) * 2 * size_t(B * t.cfg.num_kv_heads * 16 * t.cfg.head_dim) * 4);
}

TEST(DuoPolicy, MixedLayersKeepSinksPlusRecentAndTheBudgetReplayAndCountExactlyTheKeptSlots) {
    Tiny& t = tiny();
    const int64_t B = 2, T = 100, L = 40, sinks = 4, recent = 12, G = t.cfg.num_kv_heads, D = t.cfg.head_dim, nl = t.cfg.num_layers;
    ASSERT_EQ(G, 2);
    KVCacheConfig kc;
    kc.name = "duo-default";
    kc.cache_length = L;
    kc.duo_gates = "pattern:10";  // head 0 of every layer retrieval, head 1 streaming
    kc.policy_options = {{"duo_sinks", double(sinks)}, {"duo_recent", double(recent)}};
    const Tensor ids = random_ids(B, T, "duo mixed");
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    KVCache live(kc, t.cfg, Device{}, DType::F32, T);
    live.set_replay_logging(true);
    const int64_t S = L + sinks + recent;
    for (int l = 0; l < int(nl); ++l) {
        const KVPolicy& p = live.layer(l).policy();
        EXPECT_TRUE(duo_head_is_retrieval_for_test(p, 0));
        EXPECT_FALSE(duo_head_is_retrieval_for_test(p, 1));
        EXPECT_EQ(duo_head_capacity_for_test(p, 0), L);
        EXPECT_EQ(duo_head_capacity_for_test(p, 1), sinks + recent);
        EXPECT_EQ(pool_slots(p), S);
    }

    // The positions each head holds after every chunk: StreamingLLM's rule with its capacity.
    auto expected = [&](int64_t P, int64_t cap) {
        std::set<int32_t> s;
        for (int64_t p = 0; p < P; ++p)
            if (p < sinks || p >= P - (cap - sinks)) s.insert(int32_t(p));
        return s;
    };
    const std::vector<int64_t> chunks = {16, 4, 4, 8, 12, 1, 1, 2, 12, 12, 12, 4, 12};
    std::vector<std::vector<float>> outs;
    int64_t P = 0;
    for (int64_t n : chunks) {
        Tensor x = t.model.embed(ids.slice(1, P, P + n));
        for (int l = 0; l < int(nl); ++l) {
            x = t.model.block(l, x, P, live);
            outs.push_back(x.to_f32_vector());
        }
        P += n;
        for (int l = 0; l < int(nl); ++l) {
            const KVPolicy& p = live.layer(l).policy();
            const auto& pos = p.token_positions();
            for (int64_t b = 0; b < B; ++b)
                for (int64_t g = 0; g < G; ++g) {
                    std::set<int32_t> got;
                    for (int64_t s = 0; s < S; ++s)
                        if (pos[size_t((b * G + g) * S + s)] >= 0) got.insert(pos[size_t((b * G + g) * S + s)]);
                    EXPECT_EQ(got, expected(P, g == 0 ? L : sinks + recent)) << "layer " << l << " head " << g << " at " << P;
                }
        }
    }
    ASSERT_EQ(P, T);
    // f32 K and V of one pool of S slots per batch row and layer: exactly the kept slots.
    EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), int64_t(nl) * 2 * B * S * D * 4);
    EXPECT_EQ(live.buffer_bytes(), size_t(nl) * 2 * size_t(B * S * D) * 4);
    KVCache replay(kc, t.cfg, Device{}, DType::F32, T);
    std::vector<std::vector<SlotPlan>> plans;
    for (int l = 0; l < int(nl); ++l) plans.push_back(live.layer(l).replay_log().plans());
    EXPECT_EQ(run_chunks(t.model, replay, ids, chunks, &plans), outs);
}

// =========================================================================================
// the mixed attention op
// =========================================================================================

// f64 reference: softmax over an explicit mask, then the mix.
std::vector<double> mixed_reference(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                                    const std::vector<double>& alpha, int64_t B, int64_t NH, int64_t G, int64_t n, int64_t HS,
                                    double scale, int64_t sink, int64_t recent) {
    std::vector<double> y((size_t)(B * NH * n * HS), 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t i = 0; i < n; ++i)
                for (int kind = 0; kind < 2; ++kind) {
                    const int64_t g = h / (NH / G);
                    std::vector<double> s((size_t)n, -INFINITY);
                    double mx = -INFINITY;
                    for (int64_t j = 0; j <= i; ++j) {
                        const bool visible = kind == 0 || j < sink || j > i - recent;
                        if (!visible) continue;
                        double d = 0;
                        for (int64_t e = 0; e < HS; ++e) d += q[size_t(((b * NH + h) * n + i) * HS + e)] * k[size_t(((b * G + g) * n + j) * HS + e)];
                        s[size_t(j)] = d * scale;
                        mx = std::max(mx, s[size_t(j)]);
                    }
                    double z = 0;
                    for (double& x : s) z += (x = std::exp(x - mx));
                    const double w = kind == 0 ? alpha[size_t(g)] : 1 - alpha[size_t(g)];
                    for (int64_t j = 0; j < n; ++j)
                        for (int64_t e = 0; e < HS; ++e)
                            y[size_t(((b * NH + h) * n + i) * HS + e)] += w * s[size_t(j)] / z * v[size_t(((b * G + g) * n + j) * HS + e)];
                }
    return y;
}

TEST(MixedAttention, ForwardEqualsTheMaskedF64ReferenceAndGradientsEqualCentralDifferences) {
    const int64_t B = 2, NH = 4, G = 2, n = 11, HS = 4, sink = 2, recent = 3;
    const float scale = 0.7f;
    std::mt19937_64 rng(seed_for("mixed attention"));
    std::uniform_real_distribution<double> U(-1, 1);
    auto rnd = [&](int64_t m) {
        std::vector<double> x((size_t)m);
        for (double& e : x) e = U(rng);
        return x;
    };
    Tensor q = Tensor::from_f64({B, NH, n, HS}, rnd(B * NH * n * HS)), k = Tensor::from_f64({B, G, n, HS}, rnd(B * G * n * HS)),
           v = Tensor::from_f64({B, G, n, HS}, rnd(B * G * n * HS));
    std::vector<double> alpha = {0.3, 0.8};
    const std::vector<double> W = rnd(B * NH * n * HS);  // loss = sum W * y
    Tensor y = Tensor::empty({B, NH, n, HS}, DType::F64);
    MixedAttentionSaved saved;
    mixed_attention_forward(y, q, k, v, alpha, scale, sink, recent, &saved);
    const std::vector<double> ref =
        mixed_reference(q.to_f64_vector(), k.to_f64_vector(), v.to_f64_vector(), alpha, B, NH, G, n, HS, scale, sink, recent);
    const std::vector<double> got = y.to_f64_vector();
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], 1e-12) << i;

    auto loss = [&] {
        Tensor yy = Tensor::empty({B, NH, n, HS}, DType::F64);
        mixed_attention_forward(yy, q, k, v, alpha, scale, sink, recent);
        const std::vector<double> yv = yy.to_f64_vector();
        double s = 0;
        for (size_t i = 0; i < yv.size(); ++i) s += W[i] * yv[i];
        return s;
    };
    Tensor dy = Tensor::from_f64({B, NH, n, HS}, W);
    Tensor dq = Tensor::empty({B, NH, n, HS}, DType::F64), dk = Tensor::empty({B, G, n, HS}, DType::F64),
           dv = Tensor::empty({B, G, n, HS}, DType::F64);
    std::vector<double> da(2, 0.0);
    mixed_attention_backward(dq, dk, dv, da, q, k, v, alpha, scale, sink, recent, saved, dy);
    const double h = 1e-6;
    for (int64_t g = 0; g < G; ++g) {
        const double a0 = alpha[size_t(g)];
        alpha[size_t(g)] = a0 + h;
        const double lp = loss();
        alpha[size_t(g)] = a0 - h;
        const double lm = loss();
        alpha[size_t(g)] = a0;
        EXPECT_NEAR(da[size_t(g)], (lp - lm) / (2 * h), 1e-6 * std::max(1.0, std::abs(da[size_t(g)]))) << "dalpha " << g;
    }
    for (auto [t, d, name] : {std::tuple<Tensor*, Tensor*, const char*>{&q, &dq, "dq"}, {&k, &dk, "dk"}, {&v, &dv, "dv"}})
        for (int64_t i = 0; i < t->numel(); i += 7) {
            const double fd = central_difference(*t, i, h, loss);
            EXPECT_NEAR(get_elem(*d, i), fd, 1e-6 * std::max(1.0, std::abs(fd))) << name << " " << i;
        }
}

// =========================================================================================
// calibration
// =========================================================================================

TEST(DuoCalibration, GateGradientEqualsF64CentralDifferences) {
    const ModelConfig cfg = grad_test_config("llama", 2);
    auto model = grad_test_model(cfg, DType::F64, 5);
    std::mt19937_64 rng(seed_for("duo calibration fd"));
    std::vector<int32_t> ids(24);
    for (auto& x : ids) x = int32_t(rng() % uint64_t(cfg.vocab_size));
    DuoCalibrationConfig c;
    c.sink = 2, c.recent = 5, c.supervised = 8, c.reg = 0.05;
    std::vector<double> alpha = {0.9, 0.2, 0.55, 0.7};
    std::vector<double> g;
    duo_calibration_loss(*model, ids, alpha, c, &g);
    ASSERT_EQ(g.size(), alpha.size());
    const double h = 1e-6;
    for (size_t i = 0; i < alpha.size(); ++i) {
        const double a = alpha[i];
        alpha[i] = a + h;
        const double lp = duo_calibration_loss(*model, ids, alpha, c, nullptr);
        alpha[i] = a - h;
        const double lm = duo_calibration_loss(*model, ids, alpha, c, nullptr);
        alpha[i] = a;
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR(g[i], fd, 1e-6 * std::max(1.0, std::abs(fd))) << "gate " << i;
    }
    // The distance part is really there (not only the L1 term's constant).
    EXPECT_GT(std::abs(g[1] - c.reg / 4), 1e-6);
}

// Two KV heads are retrieval heads by construction: their queries are zero, so they attend
// uniformly over the whole prefix (far tokens change their output). Every other head's query
// and key projections are one matrix and q/k RMSNorm gives every query and key the same large
// norm, so each token attends (to 1e-14) only to itself — always inside the recent window, so
// streaming changes nothing for them. Calibration must rank the two planted heads first.
TEST(DuoCalibration, RanksThePlantedRetrievalHeadsFirst) {
    ModelConfig cfg = preset_config("tiny");
    cfg.num_layers = 3;
    // q/k RMSNorm (Qwen3's): every query and key has the same norm, so a token's own key
    // scores highest (dot products alone would let a long key outscore it).
    cfg.arch = Arch::QWEN3;
    cfg.model_type = arch_name(cfg.arch);
    cfg.qk_norm = true;
    TensorMap w = random_weights(cfg, 21, DType::F32);
    const int64_t E = cfg.hidden_size, HS = cfg.head_dim, G = cfg.num_kv_heads, R = cfg.num_heads / G;
    const std::set<std::pair<int64_t, int64_t>> planted = {{0, 1}, {2, 0}};  // (layer, KV head)
    std::mt19937_64 rng(seed_for("planted heads"));
    std::normal_distribution<float> N(0.0f, 1.0f);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
        for (const char* nrm : {"q_norm.weight", "k_norm.weight"}) {
            float* x = w.at(p + nrm).data<float>();
            for (int64_t i = 0; i < HS; ++i) x[i] = 6.0f;  // self score 16 * 36 / 4 = 144
        }
        float* q = w.at(p + "q_proj.weight").data<float>();
        float* k = w.at(p + "k_proj.weight").data<float>();
        for (int64_t g = 0; g < G; ++g) {
            const bool retrieval = planted.count({l, g}) > 0;
            std::vector<float> M((size_t)(HS * E));
            for (float& x : M) x = N(rng);
            for (int64_t i = 0; i < HS * E; ++i) k[g * HS * E + i] = retrieval ? 0.0f : M[size_t(i)];
            for (int64_t r = 0; r < R; ++r)
                for (int64_t i = 0; i < HS * E; ++i) q[(g * R + r) * HS * E + i] = retrieval ? 0.0f : M[size_t(i)];
        }
    }
    Transformer model(cfg, w, ModelOptions{});
    std::vector<std::vector<int32_t>> samples;
    for (int s = 0; s < 4; ++s) {
        // Distinct tokens: a repeated token's rotated key is close to its own query (the slow
        // RoPE pairs barely turn), which would pull a "local" head to a far copy.
        std::vector<int32_t> ids(200);
        std::iota(ids.begin(), ids.end(), 32);
        std::shuffle(ids.begin(), ids.end(), rng);
        ids.resize(128);
        samples.push_back(ids);
    }
    DuoCalibrationConfig c;
    c.sink = 4, c.recent = 16, c.supervised = 32, c.steps = 60;
    int64_t calls = 0;
    const std::vector<double> alpha = calibrate_duo(model, samples, c, [&](const DuoCalibrationStep&) { ++calls; });
    EXPECT_EQ(calls, c.steps);
    ASSERT_EQ(int64_t(alpha.size()), cfg.num_layers * G);
    std::vector<size_t> order(alpha.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return alpha[a] > alpha[b]; });
    std::string gates;
    for (double a : alpha) gates += " " + std::to_string(a);
    std::set<std::pair<int64_t, int64_t>> top = {{int64_t(order[0]) / G, int64_t(order[0]) % G}, {int64_t(order[1]) / G, int64_t(order[1]) % G}};
    EXPECT_EQ(top, planted) << "gates:" << gates;
    // And clearly so: the local heads collapse to 0 under the L1 term, the planted ones are held
    // up by the distance term (where they settle depends on the drawn weights: 0.48-0.99 seen).
    for (size_t i = 0; i < alpha.size(); ++i) {
        const bool p = planted.count({int64_t(i) / G, int64_t(i) % G}) > 0;
        if (p) {
            EXPECT_GT(alpha[i], 0.2) << "head " << i << " gates:" << gates;
        } else {
            EXPECT_LT(alpha[i], 0.05) << "head " << i << " should collapse to a streaming head; gates:" << gates;
        }
    }
}

// Calibration differentiates plain softmax attention; a model whose softmax has a sink logit or
// soft-capped scores is refused by name instead of calibrated against another attention.
TEST(DuoCalibration, SinksAndSoftCapsAreRefusedByName) {
    for (const bool sinks : {true, false}) {
        ModelConfig cfg = preset_config("tiny-gpt-oss");
        cfg.layer_specs.clear();  // every layer full: the sliding-window refusal must not be what fires
        cfg.attention_sinks = sinks;
        if (!sinks) cfg.attn_logit_softcap = 50.0;
        Transformer model(cfg, random_weights(cfg, 5, DType::F32), ModelOptions{});
        DuoCalibrationConfig c;
        c.sink = 2, c.recent = 4, c.supervised = 8, c.steps = 1;
        const std::vector<std::vector<int32_t>> samples = {std::vector<int32_t>(16, 40)};
        int64_t calls = 0;
        const std::string msg = error_text([&] { calibrate_duo(model, samples, c, [&](const DuoCalibrationStep&) { ++calls; }); });
        EXPECT_NE(msg.find(sinks ? "attention sinks" : "soft-caps attention scores"), std::string::npos) << msg;
        EXPECT_NE(msg.find("expected a model without"), std::string::npos) << msg;
        EXPECT_EQ(calls, 0);
    }
}

}  // namespace
}  // namespace kv::test
