// cake (CAKE, docs/POLICIES.md#cake) against an f64 reference written here from the paper's
// formulas: the budget rule on hand-worked numbers; the layer preferences, the budgets they give
// and the eviction indicator with the slots it evicts, recomputed from the raw queries and keys
// of a small case; and on the tiny model, the lengths the layers end with (summing to the total,
// different per layer) and the memory tracker's KV bytes, exactly those slots.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "engine/kv/kv_cache.h"
#include "engine/kv/policies/policy_cake.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv::test {
namespace {

TEST(CakeBudgets, HandWorkedSharesFloorsAndRounding) {
    // No floor binds: B_l = w + P_l / sum P * (total - N w) = 8 + 96 * {1, 2, 5} / 8.
    EXPECT_EQ(cake_layer_budgets({1, 2, 5}, {10, 10, 10}, 120, 8), (std::vector<int64_t>{20, 32, 68}));
    // Shares 8 + 96 / 32 = 11 fall below the floor 20: those two are pinned at 20 and the last
    // layer takes the rest, 120 - 40 = 80.
    EXPECT_EQ(cake_layer_budgets({1, 1, 30}, {20, 20, 20}, 120, 8), (std::vector<int64_t>{20, 20, 80}));
    // Equal shares 4 + 88 / 3 = 33.33: 33 each and the one left over to the lower layer.
    EXPECT_EQ(cake_layer_budgets({1, 1, 1}, {5, 5, 5}, 100, 4), (std::vector<int64_t>{34, 33, 33}));
    // No preference anywhere: equal shares.
    EXPECT_EQ(cake_layer_budgets({0, 0}, {5, 5}, 30, 2), (std::vector<int64_t>{15, 15}));
    // Floors above the total are kept as they are.
    EXPECT_EQ(cake_layer_budgets({1, 9}, {40, 40}, 60, 2), (std::vector<int64_t>{40, 40}));
}

// ---- the f64 reference ------------------------------------------------------------------

struct Case {
    int64_t B = 1, G = 2, NH = 4, D = 4;
    double scale = 0.5;
    std::mt19937_64 rng{seed_for("cake reference")};
    std::vector<float> draw(size_t n, double sd = 1.0) {
        std::normal_distribution<float> N(0.0f, float(sd));
        std::vector<float> v(n);
        for (auto& x : v) x = N(rng);
        return v;
    }
};

// Softmax weights (f64) of query `q` (D floats) at position qp over the tokens `keys` (position
// -> key, every one of them cached): entries for positions <= qp.
std::map<int32_t, double> softmax_over(const float* q, int32_t qp, const std::map<int32_t, std::vector<float>>& keys, double scale) {
    std::map<int32_t, double> a;
    double mx = -1e300;
    for (const auto& [p, k] : keys)
        if (p <= qp) {
            double z = 0;
            for (size_t d = 0; d < k.size(); ++d) z += double(q[d]) * double(k[d]);
            a[p] = scale * z;
            mx = std::max(mx, a[p]);
        }
    double s = 0;
    for (auto& [p, z] : a) s += (z = std::exp(z - mx));
    for (auto& [p, z] : a) z /= s;
    return a;
}

// The paper's per-layer statistics from the window's weights: H = -sum a log(a + 1e-10) and
// V = sum over tokens before the window of the unbiased variance over the window's queries.
// Queries q (B, NH, n, D) of a chunk at input position P0; the window = its last w queries.
struct Stats {
    double H = 0, V = 0;
    std::vector<std::map<int32_t, double>> indicator;  // per row (b, g): position -> mean + gamma var, head-averaged
};
Stats window_stats(const Case& c, const std::vector<float>& q, int64_t n, int64_t P0, int64_t w,
                   const std::vector<std::map<int32_t, std::vector<float>>>& keys, double gamma) {
    Stats st;
    const int64_t R = c.NH / c.G, q0 = P0 + n - w;
    st.indicator.resize(size_t(c.B * c.G));
    for (int64_t b = 0; b < c.B; ++b)
        for (int64_t h = 0; h < c.NH; ++h) {
            const int64_t r = b * c.G + h / R;
            std::vector<std::map<int32_t, double>> a;
            for (int64_t i = 0; i < w; ++i)
                a.push_back(softmax_over(q.data() + ((b * c.NH + h) * n + (n - w + i)) * c.D, int32_t(q0 + i), keys[size_t(r)], c.scale));
            for (const auto& [p, k] : keys[size_t(r)]) {
                double m = 0, v = 0;
                for (int64_t i = 0; i < w; ++i) m += a[size_t(i)].count(p) ? a[size_t(i)].at(p) : 0.0;
                m /= double(w);
                for (int64_t i = 0; i < w; ++i) {
                    const double x = a[size_t(i)].count(p) ? a[size_t(i)].at(p) : 0.0;
                    v += (x - m) * (x - m);
                }
                v = w > 1 ? v / double(w - 1) : 0.0;
                st.indicator[size_t(r)][p] += (m + gamma * v) / double(R);
                if (p < q0) {
                    st.V += v;
                    for (int64_t i = 0; i < w; ++i) {
                        const double x = a[size_t(i)].at(p);
                        st.H -= x * std::log(x + 1e-10);
                    }
                }
            }
        }
    return st;
}

// Average pooling over neighbours in position order, width `kernel`, zero padding counted.
std::map<int32_t, double> pooled(const std::map<int32_t, double>& u, int64_t kernel) {
    std::vector<std::pair<int32_t, double>> v(u.begin(), u.end());
    std::map<int32_t, double> out;
    const int64_t T = int64_t(v.size()), half = kernel / 2;
    for (int64_t i = 0; i < T; ++i) {
        double s = 0;
        for (int64_t k = std::max<int64_t>(0, i - half); k <= std::min(T - 1, i + half); ++k) s += v[size_t(k)].second;
        out[v[size_t(i)].first] = s / double(kernel);
    }
    return out;
}

InsertFeatures features(const Case& c, const std::vector<float>& q, const std::vector<float>& k) {
    InsertFeatures f;
    f.queries = q;
    f.query_heads = c.NH;
    f.attn_scale = float(c.scale);
    f.keys = k;
    f.head_dim = c.D;
    return f;
}

// Three linked layers of one model: the preference each measures on its prefill and the budgets
// they get, against the reference.
TEST(Cake, LayerPreferencesAndBudgetsEqualTheF64Reference) {
    Case c;
    const int64_t N = 3, L = 40;
    KVCacheConfig cfg;
    cfg.name = "cake-default";
    cfg.cache_length = L;
    cfg.snapkv_window = 4;
    const int64_t F = cfg.length_for_layer(0, 0, N);
    ASSERT_EQ(F, 10);  // ceil(0.25 * 40) = 10 > snapkv_window + 1
    KVCacheConfig chunked = cfg;
    chunked.max_chunk_size = 8;
    EXPECT_EQ(chunked.length_for_layer(0, 0, N), 18);  // 10 earlier tokens besides a chunk of 8
    EXPECT_EQ(cfg.length_for_layer(0, 0, 1), L);        // one layer: nothing to share out
    std::vector<std::unique_ptr<KVPolicy>> layers;
    std::vector<KVPolicy*> all;
    for (int64_t l = 0; l < N; ++l) layers.push_back(make_policy(cfg, F, c.G, nullptr, l)), all.push_back(layers.back().get());
    for (KVPolicy* p : all) p->capabilities().cross_layer_lengths->link_layers(all);
    const int64_t w = cake_window(*all[0]);
    ASSERT_EQ(w, 4);  // min(snapkv_window, F / 2)
    // Layers differ in how sharp their attention is: queries scaled by 0.5, 2, 4. The draw is
    // random (per-run seed), so cases where the reference itself pins a layer at its floor or
    // puts two budgets within rounding of each other are redrawn: those properties belong to
    // the case, not to the code under test, and are checked on the reference alone.
    struct LayerDraw {
        std::vector<float> q, k;
        double pref = 0;
    };
    std::vector<LayerDraw> draws;
    auto reference_budgets = [&](const std::vector<double>& pref) {
        const double psum = pref[0] + pref[1] + pref[2];
        std::vector<double> real;
        for (int64_t l = 0; l < N; ++l) real.push_back(double(w) + pref[size_t(l)] / psum * double(N * L - N * w));
        return real;
    };
    auto usable = [&](const std::vector<double>& real) {
        for (int64_t l = 0; l < N; ++l) {
            if (real[size_t(l)] <= double(F) + 0.5) return false;  // would pin (or nearly) a layer at its floor
            const double frac = real[size_t(l)] - std::floor(real[size_t(l)]);
            if (frac < 1e-3 || frac > 1 - 1e-3) return false;  // rounding within f32 noise of a boundary
            for (int64_t m = 0; m < l; ++m)
                if (std::fabs(frac - (real[size_t(m)] - std::floor(real[size_t(m)]))) < 1e-3) return false;  // tied remainders
        }
        return std::fabs(real[0] - real[2]) > 1.5;
    };
    int tries = 0;
    for (;; ++tries) {
        ASSERT_LT(tries, 200) << "no usable case in 200 draws";
        draws.clear();
        std::vector<double> pref;
        for (int64_t l = 0; l < N; ++l) {
            LayerDraw d;
            d.q = c.draw(size_t(c.B * c.NH * F * c.D), l == 0 ? 0.5 : l == 1 ? 2.0 : 4.0);
            d.k = c.draw(size_t(c.B * c.G * F * c.D));
            std::vector<std::map<int32_t, std::vector<float>>> keys(size_t(c.B * c.G));
            for (int64_t r = 0; r < c.B * c.G; ++r)
                for (int64_t t = 0; t < F; ++t)
                    keys[size_t(r)][int32_t(t)] = std::vector<float>(d.k.begin() + (r * F + t) * c.D, d.k.begin() + (r * F + t + 1) * c.D);
            const Stats st = window_stats(c, d.q, F, 0, std::min(w, F - 1), keys, 200.0);
            d.pref = st.H * st.V;  // tau1 = tau2 = 1
            pref.push_back(d.pref);
            draws.push_back(std::move(d));
        }
        if (usable(reference_budgets(pref))) break;
    }
    std::vector<double> pref;
    for (int64_t l = 0; l < N; ++l) {
        const LayerDraw& d = draws[size_t(l)];
        pref.push_back(d.pref);
        all[size_t(l)]->reset(c.B);
        EXPECT_EQ(all[size_t(l)]->capabilities().cross_layer_lengths->begin_call(0, F), F);
        all[size_t(l)]->prefill(F, features(c, d.q, d.k));
        EXPECT_NEAR(cake_preference(*all[size_t(l)]), pref.back(), 1e-5 * pref.back()) << "layer " << l;
    }
    // Budgets: w + P_l / sum P * (N L - N w), none below the floor F here, rounded down with
    // the remainder to the largest fractions.
    const std::vector<double> real = reference_budgets(pref);
    std::vector<int64_t> want;
    int64_t sum = 0;
    for (int64_t l = 0; l < N; ++l) {
        want.push_back(int64_t(std::floor(real[size_t(l)])));
        sum += want.back();
    }
    std::vector<int64_t> order = {0, 1, 2};
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return real[size_t(a)] - std::floor(real[size_t(a)]) > real[size_t(b)] - std::floor(real[size_t(b)]); });
    for (size_t i = 0; sum < N * L; ++i) ++want[size_t(order[i])], ++sum;
    for (int64_t l = 0; l < N; ++l) {
        EXPECT_EQ(all[size_t(l)]->capabilities().cross_layer_lengths->begin_call(F, 4), want[size_t(l)]) << "layer " << l;
        EXPECT_EQ(all[size_t(l)]->cache_length(), want[size_t(l)]) << "layer " << l;
        EXPECT_EQ(all[size_t(l)]->max_forward_length(), want[size_t(l)]) << "layer " << l;
    }
}

// One layer (its own budget): the indicator after the prefill and after a chunk, and the slots
// the next chunks evict, against the reference.
TEST(Cake, IndicatorAndChosenSlotsEqualTheF64Reference) {
    Case c;
    c.B = 2;
    const int64_t L = 12, kernel = 3;
    const double gamma = 200.0;
    KVCacheConfig cfg;
    cfg.name = "cake-default";
    cfg.cache_length = L;
    cfg.snapkv_window = 4;
    cfg.snapkv_kernel = kernel;
    auto pol = make_policy(cfg, L, c.G, nullptr, 0);
    const int64_t w = cake_window(*pol);
    ASSERT_EQ(w, 4);
    const int64_t rows = c.B * c.G;
    std::vector<std::map<int32_t, std::vector<float>>> keys((size_t)rows);  // the cached tokens of each row
    auto add_keys = [&](const std::vector<float>& k, int64_t n, int64_t P0) {
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t t = 0; t < n; ++t) keys[size_t(r)][int32_t(P0 + t)] = std::vector<float>(k.begin() + (r * n + t) * c.D, k.begin() + (r * n + t + 1) * c.D);
    };
    // the policy's scores per row, by token position
    auto scores_by_pos = [&]() {
        const std::vector<float> s = pol->slot_scores();
        std::vector<std::map<int32_t, double>> out((size_t)rows);
        const auto& pos = pol->token_positions();
        EXPECT_EQ(s.size(), size_t(rows * L));
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < L; ++j) out[size_t(r)][pos[size_t(r * L + j)]] = s[size_t(r * L + j)];
        return out;
    };
    auto check_scores = [&](const Stats& st, int64_t P, const char* when) {
        const auto got = scores_by_pos();
        for (int64_t r = 0; r < rows; ++r) {
            const auto want = pooled(st.indicator[size_t(r)], kernel);
            ASSERT_EQ(want.size(), got[size_t(r)].size()) << when;
            for (const auto& [p, v] : want) {
                if (p >= P + 1 - w) {  // protected from a one-token chunk: reported +inf
                    EXPECT_TRUE(std::isinf(got[size_t(r)].at(p))) << when << " row " << r << " position " << p;
                    continue;
                }
                EXPECT_NEAR(got[size_t(r)].at(p), v, 1e-5 * std::fabs(v) + 1e-9) << when << " row " << r << " position " << p;
            }
        }
    };
    // the slots a chunk of n evicts per row: the lowest reference indicators among positions
    // < P + n - w (the policy is full)
    auto check_evictions = [&](const SlotPlan& plan, const Stats& st, int64_t P, int64_t n) {
        ASSERT_EQ(plan.rows, rows);
        const auto& pos = pol->token_positions();
        for (int64_t r = 0; r < rows; ++r) {
            const auto sc = pooled(st.indicator[size_t(r)], kernel);
            std::vector<std::pair<double, int32_t>> cand;
            for (const auto& [p, v] : sc)
                if (p < P + n - w) cand.push_back({v, p});
            std::sort(cand.begin(), cand.end());
            ASSERT_GT(cand[size_t(n)].first - cand[size_t(n - 1)].first, 1e-6) << "near-tie in the reference: pick another seed";
            std::vector<int32_t> want, got;
            for (int64_t t = 0; t < n; ++t) want.push_back(cand[size_t(t)].second);
            for (int64_t t = 0; t < n; ++t) got.push_back(pos[size_t(r * L + plan.targets[size_t(r * n + t)])]);
            std::sort(want.begin(), want.end());
            std::sort(got.begin(), got.end());
            EXPECT_EQ(got, want) << "row " << r << " at position " << P;
        }
    };

    // prefill of L tokens: the window is its last min(w, L - 1) queries
    std::vector<float> q = c.draw(size_t(c.B * c.NH * L * c.D), 1.5), k = c.draw(size_t(rows * L * c.D));
    add_keys(k, L, 0);
    pol->reset(c.B);
    ASSERT_EQ(pol->capabilities().cross_layer_lengths->begin_call(0, L), L);
    pol->prefill(L, features(c, q, k));
    Stats st = window_stats(c, q, L, 0, w, keys, gamma);
    check_scores(st, L, "after the prefill");
    if (HasFatalFailure()) return;

    // a chunk of 3: evicts by the prefill's indicator, then scores with its own 3 queries
    int64_t P = L, n = 3;
    ASSERT_EQ(pol->capabilities().cross_layer_lengths->begin_call(P, n), L);
    SlotPlan plan = pol->prepare(n);
    check_evictions(plan, st, P, n);
    if (HasFatalFailure()) return;
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < n; ++t) keys[size_t(r)].erase(pol->token_positions()[size_t(r * L + plan.targets[size_t(r * n + t)])]);
    q = c.draw(size_t(c.B * c.NH * n * c.D), 1.5), k = c.draw(size_t(rows * n * c.D));
    add_keys(k, n, P);
    pol->apply(plan, features(c, q, k));
    pol->update({}, n);
    st = window_stats(c, q, n, P, n, keys, gamma);
    P += n;
    check_scores(st, P, "after a chunk of 3");
    if (HasFatalFailure()) return;

    // a decode step: one token evicts the lowest of the positions < P + 1 - w
    ASSERT_EQ(pol->capabilities().cross_layer_lengths->begin_call(P, 1), L);
    plan = pol->prepare(1);
    check_evictions(plan, st, P, 1);
}

// The tiny model through its chunked driver: layers end with different lengths summing to
// N x cache_length, each at least the prefill length, and the memory tracker's KV bytes are
// exactly those slots in f32 (K and V).
TEST(Cake, LayersKeepTheirBudgetsAndTheTrackerCountsExactlyThoseSlots) {
    const ModelConfig cfg = preset_config("tiny");
    // Layer 0's queries shrunk (near-uniform attention), the others' grown (sharp attention):
    // a random model's layers otherwise measure preferences within a few percent of each other,
    // and whether budgets differ would depend on the run's random tokens.
    TensorMap weights = random_weights(cfg, 11, DType::F32);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
        Tensor& wq = weights.at("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight");
        const float s = l == 0 ? 0.05f : 20.0f;
        for (int64_t i = 0; i < wq.numel(); ++i) wq.data<float>()[i] *= s;
    }
    Transformer model(cfg, std::move(weights), ModelOptions{});
    const int64_t B = 2, T = 96, L = 24, G = cfg.num_kv_heads, D = cfg.head_dim, nl = cfg.num_layers;
    ASSERT_GE(nl, 2);
    KVCacheConfig kc;
    kc.name = "cake-default";
    kc.cache_length = L;
    kc.snapkv_window = 4;
    // small temperatures sharpen the preference: two layers of a random model measure similar
    // statistics, and equal shares would hide whether budgets can differ
    kc.policy_options = {{"cake_tau1", 0.2}, {"cake_tau2", 0.2}};
    const int64_t F = kc.length_for_layer(0, T, nl);
    ASSERT_EQ(F, 6);  // ceil(0.25 * 24) = 6 > snapkv_window + 1 = 5
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    KVCache cache(kc, cfg, Device{}, DType::F32, T);
    std::mt19937_64 rng(seed_for("cake memory"));
    std::vector<int32_t> idv((size_t)(B * T));
    for (auto& x : idv) x = int32_t(rng() % 200 + 32);
    Tensor ids = Tensor::from_i32({B, T}, idv);
    int64_t P = 0;
    for (int64_t n = F; P < T; n = std::min<int64_t>(6, T - P)) {
        Tensor x = model.embed(ids.slice(1, P, P + n));
        for (int l = 0; l < int(nl); ++l) x = model.block(l, x, P, cache);
        P += n;
        if (P == F) {
            EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), nl * 2 * B * G * F * D * 4) << "the prefill: F slots per layer";
        }
    }
    int64_t sum = 0, lo = INT64_MAX, hi = 0;
    for (int l = 0; l < int(nl); ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        EXPECT_EQ(p.current_length(), p.cache_length()) << "layer " << l << " filled its budget";
        EXPECT_GE(p.cache_length(), F) << "layer " << l;
        sum += p.cache_length(), lo = std::min(lo, p.cache_length()), hi = std::max(hi, p.cache_length());
    }
    EXPECT_EQ(sum, nl * L);
    EXPECT_LT(lo, hi) << "budgets should differ between layers; preferences " << cake_preference(cache.layer(0).policy()) << ", "
                      << cake_preference(cache.layer(1).policy());
    EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), sum * 2 * B * G * D * 4);
    EXPECT_EQ(cache.buffer_bytes(), size_t(sum * 2 * B * G * D * 4));
}

TEST(Cake, RefusesLayerLengthsAndStorageThatCannotResize) {
    const ModelConfig cfg = preset_config("tiny");
    KVCacheConfig kc;
    kc.name = "cake-default";
    kc.cache_length = 24;
    kc.layer_cache_rule = "linear:32:16";
    try {
        KVCache c(kc, cfg, Device{}, DType::F32, 64);
        ADD_FAILURE() << "a layer length rule was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("--kv_cache.layer_cache_lengths: policy 'cake' decides every layer's length itself"),
                  std::string::npos)
            << e.what();
    }
    kc.layer_cache_rule.clear();
    kc.paged_block_size = 8;
    try {
        KVCache c(kc, cfg, Device{}, DType::F32, 64);
        ADD_FAILURE() << "paged storage was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("changes a layer's length during the sequence"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace kv::test
