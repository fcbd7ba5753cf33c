// Per-head ratio tables (docs/POLICIES.md#lukv-per-head-ratio-tables): parsing and refusals; every
// head of a lukv-* cache holding exactly max(1, round(R_{l,g} L)) slots, chosen by its scorer
// (knorm against f64 key norms the test recomputes; the other scorers against their own slot
// scores); the pool's bytes; a replay of the logged plans bit for bit with unequal budgets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/kv/head_ratios.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
int64_t lukv_head_budget_for_test(const KVPolicy& p, int64_t g);
}

namespace kv::test {
namespace {

// Budgets from the definition: max(1, round(R L)).
int64_t budget(double R, int64_t L) { return std::max<int64_t>(1, std::llround(R * double(L))); }

std::string refusal(const std::string& name, const std::string& table, int64_t layers = 2, int64_t G = 2) {
    try {
        KVCacheConfig c;
        c.name = name;
        c.cache_length = 64;
        set_head_ratios(c, table);
        validate_kv_config(c, layers, 8, G);
    } catch (const Error& e) {
        return e.what();
    }
    return "(accepted)";
}

ModelConfig small_model(int64_t N, int64_t G, int64_t D = 8) {
    ModelConfig m;
    m.vocab_size = 16, m.hidden_size = 2 * G * D, m.intermediate_size = 8, m.num_layers = N;
    m.num_heads = 2 * G, m.num_kv_heads = G, m.head_dim = D, m.max_position_embeddings = 4096;
    return m;
}

std::string cache_refusal(KVCacheConfig c, int64_t N, int64_t G) {
    try {
        KVCache cache(c, small_model(N, G), Device{}, DType::F32, 0, &byte_codec());
    } catch (const Error& e) {
        return e.what();
    }
    return "(accepted)";
}

TEST(HeadRatios, ParseListsFilesAndRefusesBadTablesByName) {
    KVCacheConfig c;
    c.name = "lukv-knorm-default";
    c.cache_length = 64;
    set_head_ratios(c, "1, 0.5; 0.25 1");
    EXPECT_EQ(c.head_ratios, "1,0.5;0.25,1");
    validate_kv_config(c, 2, 8, 2);
    EXPECT_EQ(head_budgets(c.head_ratios, 64, 2, 0), (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(head_budgets(c.head_ratios, 64, 2, 1), (std::vector<int64_t>{16, 64}));
    // a file: comments, commas or spaces, blank lines; stored as the numbers
    const std::string path = testing::TempDir() + "head_ratios_test.txt";
    {
        std::ofstream f(path);
        f << "# two layers x two KV heads\n0.9  0.7 # layer 0\n\n0.333,1\n";
    }
    set_head_ratios(c, path);
    EXPECT_EQ(c.head_ratios, "0.9,0.7;0.333,1");
    std::remove(path.c_str());
    validate_kv_config(c, 2, 8, 2);  // the run never reads the file again
    EXPECT_EQ(head_budgets(c.head_ratios, 64, 2, 1)[0], budget(0.333, 64));
    // a pattern runs over the (layer, head) pairs in order, whatever the shape
    set_head_ratios(c, "pattern: 1, 0.5");
    EXPECT_EQ(c.head_ratios, "pattern:1,0.5");
    validate_kv_config(c, 5, 8, 3);
    EXPECT_EQ(head_budgets(c.head_ratios, 10, 3, 1), (std::vector<int64_t>{5, 10, 5}));
    // the floor of one slot
    EXPECT_EQ(head_budgets("0.001,1", 64, 2, 0), (std::vector<int64_t>{1, 64}));
    set_head_ratios(c, "");
    EXPECT_EQ(c.head_ratios, "");

    auto has = [](const std::string& got, const std::string& want) {
        EXPECT_NE(got.find(want), std::string::npos) << got;
    };
    has(refusal("lukv-knorm-default", "1,1;1,1;1,1"),
        "--kv_cache.head_ratios: the table has 3 layers for a model of 2 layers; expected one line (or ';'-separated group) of ratios per layer");
    has(refusal("lukv-knorm-default", "1,1;1,0.5,0.5"),
        "--kv_cache.head_ratios: layer 1 has 3 ratios for a model of 2 KV heads; expected one ratio per KV head");
    has(refusal("lukv-knorm-default", "1,1.5;1,1"), "--kv_cache.head_ratios: layer 0, head 1 is '1.5'; expected a number in (0, 1]");
    has(refusal("lukv-knorm-default", "1,1;0,1"), "layer 1, head 0 is '0'; expected a number in (0, 1]");
    has(refusal("lukv-knorm-default", "1,1;-0.5,1"), "layer 1, head 0 is '-0.5'");
    has(refusal("lukv-knorm-default", "1,1;"), "--kv_cache.head_ratios: layer 1 has no ratio");
    has(refusal("lukv-knorm-default", "pattern:1,2"), "--kv_cache.head_ratios: pattern entry 1 is '2'");
    has(refusal("lukv-knorm-default", "/no/such/head/ratios"), "--kv_cache.head_ratios: the file '/no/such/head/ratios' cannot be read");
    has(refusal("lukv-knorm-default", ""), "--kv_cache.head_ratios is required for policy 'lukv-knorm'");
    has(refusal("knorm-default", "1,1;1,1"),
        "--kv_cache.head_ratios: policy 'knorm' keeps one budget for every head of a layer; expected a policy that keeps per-head "
        "budgets in a slot pool (lukv-knorm, lukv-snapkv, lukv-h2o, lukv-expected-attention)");
    has(refusal("lukv-snapkv-q8", "1,1;1,1"), "policy 'lukv-snapkv' runs on the buffers default, f32, bf16, f16, not 'q8'");

    // refused when the cache is built: paged or offloaded storage, a grace ring as long as a head's budget
    KVCacheConfig k;
    k.name = "lukv-h2o-default";
    k.cache_length = 16;
    set_head_ratios(k, "1,0.5;0.25,1");
    KVCacheConfig paged = k;
    paged.paged_block_size = 4;
    has(cache_refusal(paged, 2, 2), "policy 'lukv-h2o' keeps per-head lengths in a slot pool, which is neither paged nor offloadable");
    KVCacheConfig off = k;
    off.cpu_offload = true;
    has(cache_refusal(off, 2, 2), "neither paged nor offloadable");
    KVCacheConfig graced = k;
    graced.grace_period = 4;
    has(cache_refusal(graced, 2, 2), "--kv_cache.grace_period: 4 must be smaller than layer 1's smallest head budget 4");

    // with per-layer lengths the head's share is of its layer's length
    KVCacheConfig both = k;
    set_layer_cache_lengths(both, "ratios:1,0.5");
    KVCache cache(both, small_model(2, 2), Device{}, DType::F32, 0, &byte_codec());
    EXPECT_EQ(lukv_head_budget_for_test(cache.layer(0).policy(), 0), 16);
    EXPECT_EQ(lukv_head_budget_for_test(cache.layer(0).policy(), 1), 8);
    EXPECT_EQ(lukv_head_budget_for_test(cache.layer(1).policy(), 0), 2);
    EXPECT_EQ(lukv_head_budget_for_test(cache.layer(1).policy(), 1), 8);
}

// N layers of G KV heads fed random q, k, v chunk by chunk (f64 activations); keeps every key.
struct HeadCache {
    int64_t B = 2, G = 3, NH = 6, D = 8, N = 2, L;
    KVCacheConfig cfg;
    ModelConfig model;
    std::unique_ptr<KVCache> cache;
    std::mt19937_64 rng;
    std::vector<std::vector<std::map<int64_t, std::vector<double>>>> keys;  // [layer][row][pos]
    std::vector<std::vector<float>> outputs;                              // every attend's y, in call order
    int64_t P = 0;
    HeadCache(const std::string& name, const std::string& ratios, int64_t L_, int64_t grace, uint64_t seed) : L(L_), rng(seed) {
        cfg.name = name;
        cfg.cache_length = L;
        cfg.grace_period = grace;
        cfg.snapkv_window = 2;
        apply_required_options(cfg);
        set_head_ratios(cfg, ratios);
        model = small_model(N, G, D);
        cache = std::make_unique<KVCache>(cfg, model, Device{}, DType::F64, 0, &byte_codec());
        cache->set_replay_logging(true);
        keys.assign(size_t(N), std::vector<std::map<int64_t, std::vector<double>>>(size_t(B * G)));
    }
    void step(int64_t n, const std::vector<std::vector<SlotPlan>>* replay = nullptr) {
        std::uniform_real_distribution<double> u(-1.5, 1.5);
        for (int64_t l = 0; l < N; ++l) {
            std::vector<double> q(size_t(B * NH * n * D)), k(size_t(B * G * n * D)), v(size_t(B * G * n * D));
            for (double& x : q) x = u(rng);
            for (double& x : v) x = u(rng);
            for (int64_t r = 0; r < B * G; ++r)
                for (int64_t t = 0; t < n; ++t) {
                    std::vector<double> row((size_t)D);
                    for (double& x : row) x = u(rng);
                    std::copy(row.begin(), row.end(), k.begin() + (r * n + t) * D);
                    keys[size_t(l)][size_t(r)][P + t] = row;
                }
            Tensor y = Tensor::empty({B, NH, n, D}, DType::F64);
            cache->attend(int(l), Tensor::from_f64({B, NH, n, D}, q), Tensor::from_f64({B, G, n, D}, k), Tensor::from_f64({B, G, n, D}, v),
                          P, float(1.0 / std::sqrt(double(D))), 0, y, ChunkInput{.replay = replay});
            outputs.push_back(y.to_f32_vector());
        }
        P += n;
    }
    // The positions row r = (b, g) of layer l keeps: the pool's (B, G, S) positions.
    std::set<int64_t> held(int64_t l, int64_t r) const {
        const KVPolicy& p = cache->layer(int(l)).policy();
        const int64_t S = int64_t(p.token_positions().size()) / (B * G);
        std::set<int64_t> out;
        for (int64_t s = 0; s < S; ++s)
            if (const int32_t x = p.token_positions()[size_t(r * S + s)]; x >= 0) out.insert(x);
        return out;
    }
};

const std::vector<std::vector<double>> kTable = {{1, 0.5, 0.25}, {0.75, 0.25, 1}};
const char* kTableText = "1,0.5,0.25;0.75,0.25,1";

// knorm's score is minus the key's L2 norm: a head over its budget drops its old slots of largest
// f64 norm outside the grace window. The reference keeps each head's positions as a set.
void check_knorm(int64_t grace) {
    const int64_t L = 16;
    HeadCache h("lukv-knorm-default", kTableText, L, grace, 11 + uint64_t(grace));
    std::vector<std::vector<std::set<int64_t>>> ref(size_t(h.N), std::vector<std::set<int64_t>>(size_t(h.B * h.G)));
    int64_t evictions = 0;
    for (int c = 0; c < 30; ++c) {
        const int64_t n = 2;  // the prefill (2 tokens) fills no head: every eviction is by score
        for (int64_t l = 0; l < h.N; ++l)
            for (int64_t r = 0; r < h.B * h.G; ++r) {
                std::set<int64_t>& kept = ref[size_t(l)][size_t(r)];
                const int64_t C = budget(kTable[size_t(l)][size_t(r % h.G)], L);
                const int64_t e = std::max<int64_t>(0, int64_t(kept.size()) + n - C);
                std::vector<std::pair<double, int64_t>> cand;  // (norm, position), old slots outside the grace window
                for (int64_t p : kept)
                    if (p < h.P - grace) {
                        double s = 0;
                        for (double x : h.keys[size_t(l)][size_t(r)].at(p)) s += x * x;
                        cand.push_back({std::sqrt(s), p});
                    }
                ASSERT_GE(int64_t(cand.size()), e);
                std::sort(cand.rbegin(), cand.rend());  // largest norm first
                for (int64_t i = 0; i < e; ++i) kept.erase(cand[size_t(i)].second);
                evictions += e;
                for (int64_t t = 0; t < n; ++t) kept.insert(h.P + t);
            }
        h.step(n);
        for (int64_t l = 0; l < h.N; ++l)
            for (int64_t r = 0; r < h.B * h.G; ++r) {
                const int64_t C = budget(kTable[size_t(l)][size_t(r % h.G)], L);
                const std::set<int64_t> got = h.held(l, r);
                ASSERT_EQ(int64_t(got.size()), std::min(C, h.P)) << "layer " << l << " row " << r << " at " << h.P;
                ASSERT_EQ(got, ref[size_t(l)][size_t(r)]) << "layer " << l << " row " << r << " at " << h.P;
            }
    }
    EXPECT_GT(evictions, 500);
    // Memory: each layer's pool is the sum of its heads' budgets, f64 K and V of D values each.
    size_t want = 0;
    for (const auto& row : kTable) {
        int64_t S = 0;
        for (double R : row) S += budget(R, L);
        want += 2 * size_t(h.B * S * h.D) * sizeof(double);
    }
    EXPECT_EQ(h.cache->buffer_bytes(), want);
    for (int64_t l = 0; l < h.N; ++l) {
        const int64_t cmin = budget(*std::min_element(kTable[size_t(l)].begin(), kTable[size_t(l)].end()), L);
        EXPECT_EQ(h.cache->layer(int(l)).policy().cache_length(), cmin) << "layer " << l;
    }
}

TEST(HeadRatios, EachHeadKeepsItsBudgetAndTheKnormTopSlots) {
    check_knorm(0);
    check_knorm(1);
}

std::vector<std::string> head_ratio_policies() {
    std::vector<std::string> out;
    for (const PolicyInfo& p : policy_registry())
        if (std::find(p.uses.begin(), p.uses.end(), "head_ratios") != p.uses.end()) out.push_back(p.name);
    return out;
}

// Every lukv-* policy: after each chunk every head holds exactly min(C_g, P) slots, and a head
// that evicted dropped the lowest of its own old slots by the scorer's scores before the chunk;
// a second cache fed the logged plans rebuilds every output bit for bit.
TEST(HeadRatios, EveryScorerKeepsEachHeadsBudgetByItsOwnScoresAndReplaysBitForBit) {
    const std::vector<std::string> names = head_ratio_policies();
    ASSERT_GE(names.size(), 4u);
    const int64_t L = 16;
    for (const std::string& name : names) {
        SCOPED_TRACE(name);
        HeadCache h(name + "-default", kTableText, L, 0, 7);
        int64_t checked = 0;
        for (int c = 0; c < 24; ++c) {
            const int64_t n = c == 0 ? 4 : 2;  // the prefill fills layer 0's head 2 and layer 1's head 1 (4 slots)
            std::vector<std::vector<std::vector<float>>> before(size_t(h.N));
            std::vector<std::vector<int32_t>> pos_before(size_t(h.N));
            for (int64_t l = 0; l < h.N; ++l) {
                const KVPolicy& p = h.cache->layer(int(l)).policy();
                pos_before[size_t(l)] = p.token_positions();
                const std::vector<float> sc = h.P > 0 ? p.slot_scores() : std::vector<float>();
                before[size_t(l)].push_back(sc);
            }
            const int64_t P0 = h.P;
            h.step(n);
            for (int64_t l = 0; l < h.N; ++l) {
                const std::vector<int32_t>& old = pos_before[size_t(l)];
                const std::vector<float>& sc = before[size_t(l)][0];
                const int64_t S = int64_t(old.size()) / (h.B * h.G);
                for (int64_t r = 0; r < h.B * h.G; ++r) {
                    const int64_t C = budget(kTable[size_t(l)][size_t(r % h.G)], L);
                    const std::set<int64_t> got = h.held(l, r);
                    ASSERT_EQ(int64_t(got.size()), std::min(C, h.P)) << "layer " << l << " row " << r << " at " << h.P;
                    for (int64_t t = 0; t < n; ++t) ASSERT_TRUE(got.count(P0 + t)) << "a new token is kept";
                    if (P0 == 0 || sc.empty()) continue;
                    // evicted: the old slots the head no longer keeps
                    std::vector<std::pair<float, int64_t>> cand;  // (score, slot) of the head's old slots
                    std::set<int64_t> gone;
                    for (int64_t s = 0; s < S; ++s) {
                        const int32_t x = old[size_t(r * S + s)];
                        if (x < 0) continue;
                        cand.push_back({sc[size_t(r * S + s)], s});
                        if (!got.count(x)) gone.insert(s);
                    }
                    const int64_t e = std::max<int64_t>(0, int64_t(cand.size()) + n - C);
                    ASSERT_EQ(int64_t(gone.size()), e) << "layer " << l << " row " << r << " at " << h.P;
                    // the first chunk after a prefill that filled the head follows the keep-initial rule instead
                    const bool initial = P0 == 4 && C == 4;
                    if (e == 0 || initial) continue;
                    std::sort(cand.begin(), cand.end());
                    std::set<int64_t> lowest;
                    for (int64_t i = 0; i < e; ++i) lowest.insert(cand[size_t(i)].second);
                    ASSERT_EQ(gone, lowest) << "layer " << l << " row " << r << " at " << h.P;
                    ++checked;
                }
            }
        }
        EXPECT_GT(checked, 100);

        // replay the log through a fresh cache: the same outputs, bit for bit
        std::vector<std::vector<SlotPlan>> plans;
        for (int64_t l = 0; l < h.N; ++l) plans.push_back(h.cache->layer(int(l)).replay_log().plans());
        HeadCache again(name + "-default", kTableText, L, 0, 7);
        for (int c = 0; c < 24; ++c) again.step(c == 0 ? 4 : 2, &plans);
        ASSERT_EQ(again.outputs.size(), h.outputs.size());
        for (size_t i = 0; i < h.outputs.size(); ++i) ASSERT_EQ(again.outputs[i], h.outputs[i]) << "output " << i;
    }
}

}  // namespace
}  // namespace kv::test
