// Per-layer ratio tables (docs/POLICIES.md#per-layer-ratio-tables-lukv): parsing and refusals,
// and every layer of a cache keeping exactly round(R_l * cache_length) slots, chosen by its
// scorer (knorm, whose score is an f64 key norm the test recomputes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/kv/kv_config.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

std::string refusal(KVCacheConfig& c, const std::string& text, int64_t layers = 3) {
    try {
        set_layer_cache_lengths(c, text);
        validate_kv_config(c, layers, 8, 2);
    } catch (const Error& e) {
        return e.what();
    }
    return "(accepted)";
}

TEST(LayerRatios, ParseListsFilesAndRefusesBadTablesByName) {
    KVCacheConfig c;
    c.name = "h2o-default";
    c.cache_length = 64;
    set_layer_cache_lengths(c, "ratios:1, 0.5,0.25");
    EXPECT_EQ(layer_cache_lengths_text(c), "ratios:1,0.5,0.25");
    validate_kv_config(c, 3, 8, 2);
    EXPECT_EQ(c.length_for_layer(0, 1000, 3), 64);
    EXPECT_EQ(c.length_for_layer(1, 1000, 3), 32);
    EXPECT_EQ(c.length_for_layer(2, 1000, 3), 16);
    // a file: comments, spaces and line breaks; stored as the numbers
    const std::string path = testing::TempDir() + "layer_ratios_test.txt";
    {
        std::ofstream f(path);
        f << "# three layers\n0.9  0.7 # middle\n\n0.333\n";
    }
    set_layer_cache_lengths(c, "ratios:" + path);
    EXPECT_EQ(layer_cache_lengths_text(c), "ratios:0.9,0.7,0.333");
    EXPECT_EQ(c.length_for_layer(2, 1000, 3), std::llround(0.333 * 64));
    std::remove(path.c_str());
    // the floor of one slot
    set_layer_cache_lengths(c, "ratios:1,0.5,0.001");
    EXPECT_EQ(c.length_for_layer(2, 1000, 3), 1);

    EXPECT_NE(refusal(c, "ratios:1,0.5").find("the ratio table has 2 entries for a model of 3 layers; expected one ratio per layer"),
              std::string::npos) << refusal(c, "ratios:1,0.5");
    EXPECT_NE(refusal(c, "ratios:1,1.5,0.5").find("ratio 1 is '1.5'; expected a number in (0, 1]"), std::string::npos);
    EXPECT_NE(refusal(c, "ratios:1,0.5,0").find("ratio 2 is '0'; expected a number in (0, 1]"), std::string::npos);
    EXPECT_NE(refusal(c, "ratios:1,-0.5,1").find("ratio 1 is '-0.5'"), std::string::npos);
    EXPECT_NE(refusal(c, "ratios:/no/such/ratio/file").find("the file '/no/such/ratio/file' cannot be read"), std::string::npos);
    EXPECT_NE(refusal(c, "ratios:").find("holds no ratio"), std::string::npos);
    KVCacheConfig nolen;
    nolen.name = "h2o-default";
    EXPECT_NE(refusal(nolen, "ratios:1,0.5,0.5").find("--kv_cache.cache_length is required"), std::string::npos)
        << refusal(nolen, "ratios:1,0.5,0.5");
}

struct MultiLayer {
    int64_t B = 2, G = 2, NH = 4, D = 8, N = 3;
    KVCacheConfig cfg;
    ModelConfig model;
    std::unique_ptr<KVCache> cache;
    std::mt19937_64 rng{5};
    std::vector<std::vector<std::map<int64_t, std::vector<double>>>> keys;  // [layer][row][pos]
    int64_t P = 0;
    MultiLayer(const std::string& name, const std::string& ratios, int64_t L) {
        cfg.name = name;
        cfg.cache_length = L;
        set_layer_cache_lengths(cfg, ratios);
        apply_required_options(cfg);
        model.vocab_size = 16, model.hidden_size = NH * D, model.intermediate_size = 8, model.num_layers = N;
        model.num_heads = NH, model.num_kv_heads = G, model.head_dim = D, model.max_position_embeddings = 4096;
        validate_kv_config(cfg, N, D, G);
        cache = std::make_unique<KVCache>(cfg, model, Device{}, DType::F64, 0, &byte_codec());
        cache->set_replay_logging(true);
        keys.assign(size_t(N), std::vector<std::map<int64_t, std::vector<double>>>(size_t(B * G)));
    }
    void step(int64_t n) {
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
                          P, float(1.0 / std::sqrt(double(D))), 0, y);
        }
        P += n;
    }
};

TEST(LayerRatios, EachLayerKeepsItsBudgetAndTheScorersTopSlots) {
    MultiLayer m("knorm-default", "ratios:1,0.5,0.25", 16);
    const std::vector<int64_t> want = {16, 8, 4};
    int64_t checked = 0;
    for (int c = 0; c < 24; ++c) {
        // before the chunk: each full layer's row must lose the n slots of largest f64 key norm
        std::vector<std::vector<std::vector<int32_t>>> expect(size_t(m.N));
        std::vector<bool> full(size_t(m.N));
        for (int64_t l = 0; l < m.N; ++l) {
            const KVPolicy& p = m.cache->layer(int(l)).policy();
            full[size_t(l)] = m.P > 0 && p.current_length() == want[size_t(l)];
            if (!full[size_t(l)]) continue;
            for (int64_t r = 0; r < m.B * m.G; ++r) {
                std::vector<std::pair<double, int32_t>> sc;  // (score = -||k||, slot)
                for (int64_t s = 0; s < want[size_t(l)]; ++s) {
                    const int32_t pos = p.token_positions()[size_t(r * want[size_t(l)] + s)];
                    double nn = 0;
                    for (double x : m.keys[size_t(l)][size_t(r)].at(pos)) nn += x * x;
                    sc.push_back({-std::sqrt(nn), int32_t(s)});
                }
                std::sort(sc.begin(), sc.end());
                std::vector<int32_t> lowest;
                for (int i = 0; i < 2; ++i) lowest.push_back(sc[size_t(i)].second);
                std::sort(lowest.begin(), lowest.end());
                expect[size_t(l)].push_back(lowest);
            }
        }
        m.step(2);
        for (int64_t l = 0; l < m.N; ++l) {
            const LayerCache& lc = m.cache->layer(int(l));
            EXPECT_EQ(lc.policy().cache_length(), want[size_t(l)]) << "layer " << l;
            EXPECT_EQ(lc.policy().current_length(), std::min(want[size_t(l)], m.P)) << "layer " << l << " at " << m.P;
            if (!full[size_t(l)]) continue;
            const SlotPlan& plan = m.cache->layer(int(l)).replay_log().plans().back();
            for (int64_t r = 0; r < m.B * m.G; ++r) {
                std::vector<int32_t> got(plan.targets.begin() + (plan.rows == 1 ? 0 : r) * plan.n,
                                         plan.targets.begin() + (plan.rows == 1 ? 0 : r) * plan.n + plan.n);
                std::sort(got.begin(), got.end());
                ASSERT_EQ(got, expect[size_t(l)][size_t(r)]) << "layer " << l << " row " << r << " at " << m.P;
                ++checked;
            }
        }
    }
    EXPECT_GT(checked, 100);
}

TEST(LayerRatios, KeyRerotationKeepsEachLayersBudget) {
    MultiLayer m("key-rerotation-h2o-default", "ratios:0.5,1,0.75", 8);
    for (int c = 0; c < 12; ++c) m.step(2);
    const std::vector<int64_t> want = {4, 8, 6};
    for (int64_t l = 0; l < m.N; ++l) {
        EXPECT_EQ(m.cache->layer(int(l)).policy().current_length(), want[size_t(l)]) << "layer " << l;
        int64_t filled = 0;
        for (int32_t p : m.cache->layer(int(l)).policy().token_positions()) filled += p >= 0;
        EXPECT_EQ(filled, want[size_t(l)] * m.B * m.G) << "layer " << l;
    }
}

}  // namespace
}  // namespace kv::test
