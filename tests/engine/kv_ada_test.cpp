// Ada-KV (ada-snapkv, ada-expected-attention) and the per-head lengths under it: the eviction
// rule against a hand-computed case and an f64 reference written as kvpress' AdaKVPress does it
// (safeguarded slots lifted to +inf, then one top-k over all heads); the memory tracker counts
// exactly the pool's kept slots; per-head counts really differ. The registry loops
// (kv_registry_test, kv_invariants_test, grad_fd_test, generation_decode_test) cover replay,
// invariants, FD gradients and decode eviction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "engine/memory/memory_tracker.h"
#include "engine/model/presets.h"
#include "engine/model/transformer.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
std::vector<int32_t> ada_choose_evictions_for_test(const KVPolicy& p, const std::vector<float>& sc, const std::vector<int32_t>& pos,
                                                   int64_t n, int64_t P);
}

namespace kv::test {
namespace {

std::unique_ptr<KVPolicy> ada(const std::string& name, int64_t L, int64_t G, double alpha, int64_t grace) {
    KVCacheConfig kc;
    kc.name = name;
    kc.cache_length = L;
    kc.grace_period = grace;
    kc.policy_options["ada_alpha"] = alpha;
    return make_policy(kc, L, G);
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
    std::sort(v.begin(), v.end());
    return v;
}

TEST(AdaKV, HandCaseEvictsTheLowestOverAllHeadsAboveTheSafeguard) {
    // G = 2 heads, L = 4 (pool S = 8), chunk n = 2, all 8 tokens old (P = 8): head 0 holds the
    // even slots with scores 0.1 .. 0.4, head 1 the odd ones with 5 .. 8.
    const std::vector<int32_t> pos = {0, -1, 1, -1, 2, -1, 3, -1,   // head 0
                                      -1, 4, -1, 5, -1, 6, -1, 7};  // head 1
    std::vector<float> sc(16, 0.0f);
    const float h0[4] = {0.1f, 0.2f, 0.3f, 0.4f}, h1[4] = {5, 6, 7, 8};
    for (int i = 0; i < 4; ++i) sc[size_t(2 * i)] = h0[i], sc[size_t(8 + 2 * i + 1)] = h1[i];
    // alpha 0: plain top-k over both heads -> all four of head 0 (it keeps only its 2 new tokens).
    EXPECT_EQ(sorted(ada_choose_evictions_for_test(*ada("ada-snapkv-default", 4, 2, 0.0, 0), sc, pos, 2, 8)),
              (std::vector<int32_t>{0, 2, 4, 6}));
    // alpha 0.5: floor(0.5 * 4) = 2 old slots per head besides its 2 new tokens; head 0 keeps
    // its best two (0.3, 0.4: slots 4, 6), so evictions 3 and 4 are head 1's lowest (5, 6:
    // slots 1, 3). (Counting the new tokens toward the 2, head 0 lost every old slot: 0, 2, 4, 6.)
    EXPECT_EQ(sorted(ada_choose_evictions_for_test(*ada("ada-snapkv-default", 4, 2, 0.5, 0), sc, pos, 2, 8)),
              (std::vector<int32_t>{0, 1, 2, 3}));
    // alpha 0.25: one old slot per head; head 0 keeps slot 6 (0.4), head 1 gives slot 1 (5).
    EXPECT_EQ(sorted(ada_choose_evictions_for_test(*ada("ada-snapkv-default", 4, 2, 0.25, 0), sc, pos, 2, 8)),
              (std::vector<int32_t>{0, 1, 2, 4}));
    // A grace period of 2 protects positions 6, 7 (head 1's slots 13, 15): nothing changes
    // at alpha 0, since they are not among the lowest.
    EXPECT_EQ(sorted(ada_choose_evictions_for_test(*ada("ada-snapkv-default", 4, 2, 0.0, 2), sc, pos, 2, 8)),
              (std::vector<int32_t>{0, 2, 4, 6}));
}

TEST(AdaKV, EvictionsEqualTheF64ReferenceOnRandomPools) {
    std::mt19937_64 rng(seed_for("ada reference"));
    int compared = 0;
    for (int trial = 0; trial < 200; ++trial) {
        const int64_t G = 1 + int64_t(rng() % 4), L = 6 + int64_t(rng() % 10), S = G * L;
        const int64_t grace = int64_t(rng() % 3), n = 1 + int64_t(rng() % 3);
        const double alpha = std::vector<double>{0.0, 0.2, 0.5}[rng() % 3];
        const int64_t need = std::max<int64_t>(grace, int64_t(std::floor(alpha * double(L))));
        if (n > L - need) continue;
        // A full pool: each slot to a random head, but every head keeps >= floor(alpha L).
        std::vector<int32_t> owner((size_t)S);
        for (int64_t s = 0; s < S; ++s) owner[size_t(s)] = int32_t(s % G);
        std::shuffle(owner.begin(), owner.end(), rng);
        for (int64_t s = 0; s < S; ++s)
            if (rng() % 3 == 0 && std::count(owner.begin(), owner.end(), owner[size_t(s)]) > need + n + 1) owner[size_t(s)] = int32_t(rng() % G);
        const int64_t P = 3 * L;
        std::vector<int32_t> pos(size_t(G * S), -1);
        std::vector<int32_t> next((size_t)G, 0);
        for (int64_t s = 0; s < S; ++s) {  // positions increase with the slot, P - 1 the last ones
            const int64_t g = owner[size_t(s)];
            pos[size_t(g * S + s)] = int32_t(P - S + s);
            ++next[size_t(g)];
        }
        std::vector<float> sc(size_t(G * S));
        std::vector<double> scd(sc.size());
        for (size_t i = 0; i < sc.size(); ++i) sc[i] = float(rng() % 50) / 7.0f, scd[i] = double(sc[i]);  // ties happen
        auto pol = ada("ada-snapkv-default", L, G, alpha, grace);
        bool feasible = true;
        for (int64_t g = 0; g < G; ++g) feasible = feasible && next[size_t(g)] >= 1;
        if (!feasible) continue;
        std::vector<int32_t> got;
        try {
            got = sorted(ada_choose_evictions_for_test(*pol, sc, pos, n, P));
        } catch (const Error&) {
            continue;  // not enough evictable slots in this drawn pool: the reference agrees below
        }
        EXPECT_EQ(got, ada_reference(G, S, L, scd, pos, n, P, grace, alpha)) << "trial " << trial << " G " << G << " L " << L;
        ++compared;
    }
    EXPECT_GE(compared, 100) << "too few drawn pools were feasible to compare";
}

TEST(AdaKV, MemoryTrackerCountsExactlyThePoolAndHeadsHoldDifferentCounts) {
    const ModelConfig cfg = preset_config("tiny");
    Transformer model(cfg, random_weights(cfg, 7, DType::F32), ModelOptions{});
    const int64_t B = 2, T = 96, L = 24, G = cfg.num_kv_heads, D = cfg.head_dim, nl = cfg.num_layers;
    ASSERT_GE(G, 2);
    KVCacheConfig kc;
    kc.name = "ada-snapkv-default";
    kc.cache_length = L;
    kc.snapkv_window = 4;
    MemoryTracker tr;
    MemoryTrackerScope scope(tr);
    KVCache cache(kc, cfg, Device{}, DType::F32, T);
    std::mt19937_64 rng(seed_for("ada memory"));
    std::vector<int32_t> idv((size_t)(B * T));
    for (auto& x : idv) x = int32_t(rng() % 200 + 32);
    Tensor ids = Tensor::from_i32({B, T}, idv);
    int64_t P = 0;
    for (int64_t n : {int64_t(16), int64_t(8), int64_t(8), int64_t(8), int64_t(8), int64_t(8), int64_t(8), int64_t(8), int64_t(8),
                      int64_t(8), int64_t(8)}) {
        Tensor x = model.embed(ids.slice(1, P, P + n));
        for (int l = 0; l < int(nl); ++l) x = model.block(l, x, P, cache);
        P += n;
    }
    ASSERT_EQ(P, T);
    // Only the pools are KV storage: f32 K and V of B x G x L slots per layer, nothing per head.
    EXPECT_EQ(tr.current(Device{}, MemCategory::KV_CACHE), int64_t(nl) * 2 * B * G * L * D * 4);
    EXPECT_EQ(cache.buffer_bytes(), size_t(nl) * 2 * size_t(B * G * L * D) * 4);
    // Heads keep different numbers of slots (the point of Ada-KV), summing to the budget.
    bool uneven = false;
    for (int l = 0; l < int(nl); ++l) {
        const KVPolicy& p = cache.layer(l).policy();
        const int64_t S = pool_slots(p);
        ASSERT_EQ(S, G * L);
        for (int64_t b = 0; b < B; ++b) {
            int64_t total = 0;
            for (int64_t g = 0; g < G; ++g) {
                const auto& pos = p.token_positions();
                const int64_t c = std::count_if(pos.begin() + (b * G + g) * S, pos.begin() + (b * G + g + 1) * S, [](int32_t x) { return x >= 0; });
                EXPECT_GE(c, int64_t(0.2 * double(L))) << "layer " << l << " head " << g;
                uneven = uneven || c != L;
                total += c;
            }
            EXPECT_EQ(total, G * L) << "layer " << l << " batch row " << b;
        }
    }
    EXPECT_TRUE(uneven) << "every head kept exactly L slots: the allocation never adapted";
}

// ---- the wrapped scorers over the pool ---------------------------------------------------
// An ada-* layer of 2 heads x L = 6 (pool S = 12, 2 batch rows) through chunks of several sizes:
// once the pool is full, after every chunk each head's score of every slot it keeps must equal
// the f64 reference of its scorer computed over that head's own slots alone (slot_scores() is
// +inf on the others), and the next chunk must evict the G n slots Ada's rule (ada_reference,
// alpha 0.2) picks on those scores.
using PoolRef = std::function<std::vector<double>(const LayerHarness&, int64_t n)>;

void check_pool_scores(const std::string& name, const std::function<void(KVCacheConfig&)>& setup, const PoolRef& ref_of,
                       const std::function<void(KVCache&)>& prepare = {}) {
    LayerHarness h(name, 6, seed_for(name + " pool scores"));
    setup(h.cfg);
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0);
    if (prepare) prepare(*h.cache);
    h.cache->set_replay_logging(true);
    const int64_t G = h.G, L = h.L, S = G * L;
    h.step(4);
    std::vector<float> scores;  // after the last chunk, (B, G, S); empty before the pool is full
    std::vector<int32_t> pos_then;
    int checked = 0, compared = 0;
    for (int64_t n : {2, 3, 1, 5, 2, 4, 3, 1, 2, 5}) {
        const int64_t P = h.P;
        h.step(n);
        if (!scores.empty()) {
            const SlotPlan& plan = h.layer().replay_log().plans().back();
            for (int64_t b = 0; b < h.B; ++b) {
                const std::vector<double> sc(scores.begin() + b * G * S, scores.begin() + (b + 1) * G * S);
                const std::vector<int32_t> pb(pos_then.begin() + b * G * S, pos_then.begin() + (b + 1) * G * S);
                const std::vector<int32_t> got(plan.targets.begin() + b * G * n, plan.targets.begin() + (b + 1) * G * n);
                EXPECT_EQ(sorted(got), ada_reference(G, S, L, sc, pb, n, P, 0, 0.2)) << name << ": evictions of batch row " << b << " at " << P;
            }
            ++compared;
        }
        scores.clear();
        if (h.P < L) continue;
        const std::vector<double> ref = ref_of(h, n);
        const std::vector<float> got = h.layer().policy().slot_scores();
        const std::vector<int32_t>& pos = h.layer().policy().token_positions();
        ASSERT_EQ(got.size(), size_t(h.B * G * S)) << name;
        ASSERT_EQ(ref.size(), got.size()) << name;
        for (size_t i = 0; i < got.size(); ++i) {
            if (pos[i] < 0) {
                EXPECT_EQ(got[i], std::numeric_limits<float>::infinity()) << name << ": entry " << i << ", a slot its head does not keep";
                continue;
            }
            ASSERT_NEAR(got[i], ref[i], 2e-6 * std::max(1.0, std::fabs(ref[i])))
                << name << " after position " << h.P << ": row " << i / size_t(S) << " slot " << i % size_t(S) << " (position " << pos[i] << ")";
        }
        scores = got, pos_then = pos;
        ++checked;
    }
    EXPECT_GE(checked, 9) << name;
    EXPECT_GE(compared, 8) << name;
}

// The pool slots head row r keeps, in token-position order.
std::vector<int64_t> own_slots(const std::vector<int32_t>& pos, int64_t r, int64_t S) {
    std::vector<int64_t> o;
    for (int64_t s = 0; s < S; ++s)
        if (pos[size_t(r * S + s)] >= 0) o.push_back(s);
    std::sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return pos[size_t(r * S + a)] < pos[size_t(r * S + b)]; });
    return o;
}

// SnapKV (docs/POLICIES.md#score-policies-decisions-per-b-g-row) in f64 over each head's own
// slots: the chunk's last `win` queries of the group's heads, softmax over the head's slots they
// can see (position <= theirs), averaged over the group, summed over the queries; then a
// width-k mean over the head's slots in position order (zero padding).
std::vector<double> pooled_snapkv_reference(const LayerHarness& h, int64_t n, int64_t win, int64_t k) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t S = pool_slots(pol), R = h.NH / h.G, P0 = h.P - n;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * S), std::numeric_limits<double>::infinity());
    for (int64_t b = 0; b < h.B; ++b)
        for (int64_t g = 0; g < h.G; ++g) {
            const int64_t r = b * h.G + g;
            const std::vector<int64_t> own = own_slots(pos, r, S);
            std::vector<double> w(own.size(), 0.0);
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh)
                for (int64_t i = n - std::min(win, n); i < n; ++i) {
                    std::vector<double> e(own.size(), -INFINITY);
                    double m = -INFINITY, z = 0;
                    for (size_t j = 0; j < own.size(); ++j) {
                        const int32_t p = pos[size_t(r * S + own[j])];
                        if (p > P0 + i) continue;
                        const auto& key = h.history[size_t(r)].at(p).first;
                        double dot = 0;
                        for (int64_t d = 0; d < h.D; ++d) dot += qv[size_t(((b * h.NH + hh) * n + i) * h.D + d)] * double(key[size_t(d)]);
                        m = std::max(m, e[j] = dot / std::sqrt(double(h.D)));
                    }
                    for (double& x : e) z += (x = std::exp(x - m));
                    for (size_t j = 0; j < own.size(); ++j) w[j] += e[j] / z / double(R);
                }
            for (int64_t i = 0; i < int64_t(own.size()); ++i) {
                double acc = 0;
                for (int64_t o = i - k / 2; o <= i + k / 2; ++o)
                    if (o >= 0 && o < int64_t(own.size())) acc += w[size_t(o)];
                out[size_t(r * S + own[size_t(i)])] = acc / double(k);
            }
        }
    return out;
}

// Expected Attention (docs/POLICIES.md#expected-attention) in f64 over each head's own slots:
// every query seen at positions >= sink, rotated back by -p theta_i on pairs (i, i + D/2); per
// (b, query head) mean and population covariance, moved by the mean rotation over the next F
// positions; exponent s k.mu' + s^2 k^T Sigma' k / 2 over the head's non-sink keys, softmax,
// mean over the group's heads, times |v|; the head's sinks take the layer's maximum.
std::vector<double> pooled_expected_attention_reference(const LayerHarness& h, const std::vector<double>& theta, int64_t F, int64_t sink) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t S = pool_slots(pol), D = h.D, R = h.NH / h.G, Pa = h.P;
    const auto& pos = pol.token_positions();
    const double s = 1.0 / std::sqrt(double(D));
    const auto qs = prerope_queries(h, theta, sink);  // per (b, head)
    double top = -INFINITY;  // over every head of the layer
    std::vector<double> out((size_t)(h.B * h.G * S), std::numeric_limits<double>::infinity());
    for (int64_t b = 0; b < h.B; ++b)
        for (int64_t g = 0; g < h.G; ++g) {
            const int64_t r = b * h.G + g;
            const std::vector<int64_t> own = own_slots(pos, r, S);
            std::vector<double> a(own.size(), 0.0);
            for (int64_t hh = g * R; hh < (g + 1) * R; ++hh) {
                const auto& Q = qs[size_t(b * h.NH + hh)];
                const FutureQueryMoments fm = future_query_moments(Q, theta, Pa, F, D);
                const std::vector<double>&m2 = fm.mean, &C2 = fm.cov;
                std::vector<double> z(own.size(), 0.0);
                double zs = 0;
                for (size_t j = 0; j < own.size(); ++j) {
                    const int32_t p = pos[size_t(r * S + own[j])];
                    if (p < sink) continue;
                    const auto& k = h.history[size_t(r)].at(p).first;
                    double lin = 0, quad = 0;
                    for (int64_t d = 0; d < D; ++d) lin += double(k[size_t(d)]) * m2[size_t(d)];
                    for (int64_t d = 0; d < D; ++d)
                        for (int64_t e = 0; e < D; ++e) quad += double(k[size_t(d)]) * C2[size_t(d * D + e)] * double(k[size_t(e)]);
                    zs += (z[j] = std::exp(s * lin + s * s * quad / 2));
                }
                for (size_t j = 0; j < own.size(); ++j) a[j] += z[j] / zs / double(R);
            }
            for (size_t j = 0; j < own.size(); ++j) {
                const int32_t p = pos[size_t(r * S + own[j])];
                if (p < sink) continue;
                double vn = 0;
                for (float x : h.history[size_t(r)].at(p).second) vn += double(x) * double(x);
                top = std::max(top, out[size_t(r * S + own[j])] = a[j] * std::sqrt(vn));
            }
        }
    // a head's sinks take the maximum over the whole layer (kvpress pads them with scores.max()),
    // so they survive the top-k over all heads' slots
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j : own_slots(pos, r, S))
            if (pos[size_t(r * S + j)] < sink) out[size_t(r * S + j)] = top;
    return out;
}

TEST(AdaKV, SnapKVScoresEachHeadOverItsOwnSlotsAsTheF64Reference) {
    // window 3 of each chunk's queries, pooling width 3; the reference pools the window's own
    // tokens too (kvlab's earlier rule, snapkv_pool_window 1; the published rule: SnapKV.*)
    check_pool_scores(
        "ada-snapkv-default", [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3, c.policy_options = {{"snapkv_pool_window", 1}}; },
        [](const LayerHarness& h, int64_t n) { return pooled_snapkv_reference(h, n, 3, 3); });
}

TEST(AdaKV, ExpectedAttentionScoresEachHeadOverItsOwnSlotsAsTheF64Reference) {
    // D = 16 fully rotated with base 10000, 6 future positions, 2 sinks. Before the fix the
    // wrapped scorer never saw a query (ada bypassed its apply()), so every score stayed 0.
    std::vector<double> theta(8);
    for (int i = 0; i < 8; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * i / 16.0);
    check_pool_scores(
        "ada-expected-attention-default", [](KVCacheConfig& c) { c.policy_options = {{"ea_n_future_positions", 6}, {"ea_n_sink", 2}}; },
        [&theta](const LayerHarness& h, int64_t) { return pooled_expected_attention_reference(h, theta, 6, 2); },
        [&theta](KVCache& c) { c.set_rope_frequencies(&theta); });
}

// The positions each head row keeps (sorted), -1 slots left out.
std::vector<std::vector<int32_t>> kept_positions(const KVPolicy& p) {
    const int64_t S = pool_slots(p) > 0 ? pool_slots(p) : p.cache_length();
    const auto& pos = p.token_positions();
    std::vector<std::vector<int32_t>> out(pos.size() / size_t(S));
    for (size_t r = 0; r < out.size(); ++r) {
        for (int64_t s = 0; s < S; ++s)
            if (pos[r * size_t(S) + size_t(s)] >= 0) out[r].push_back(pos[r * size_t(S) + size_t(s)]);
        std::sort(out[r].begin(), out[r].end());
    }
    return out;
}

TEST(AdaKV, FirstEvictionAfterAFullPrefillDropsTheSamePositionsInEveryHeadAsTheBaseScorer) {
    // A prefill records no attention weights, so before the first eviction after a full prefill
    // every score is 0. The base scorers then apply the keep-initial rule (drop positions
    // [keep, keep + n), keep = min(int(f L), L - n)); ada-* ran its top-k over the ties and
    // evicted head 0's first G n tokens (sink included) in every layer. L = 20, f = 0.25: keep 5;
    // the chunk of 3 drops positions 5, 6, 7 in every head. The next chunk goes by Ada's rule.
    std::vector<double> theta(8);
    for (int i = 0; i < 8; ++i) theta[size_t(i)] = std::pow(10000.0, -2.0 * i / 16.0);
    for (const auto& [ada_name, base_name] : {std::pair<std::string, std::string>{"ada-snapkv-default", "snapkv-default"},
                                              {"ada-expected-attention-default", "expected-attention-default"}}) {
        std::vector<std::vector<int32_t>> kept;
        for (const std::string& name : {ada_name, base_name}) {
            LayerHarness h(name, 20, seed_for("ada initial rule"));
            h.cfg.keep_initial_fraction = 0.25;
            h.cfg.snapkv_window = 3;
            if (name.find("expected-attention") != std::string::npos) h.cfg.policy_options = {{"ea_n_future_positions", 6}, {"ea_n_sink", 2}};
            h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0);
            h.cache->set_rope_frequencies(&theta);
            h.cache->set_replay_logging(true);
            h.step(20);
            h.step(3);
            const std::vector<std::vector<int32_t>> got = kept_positions(h.layer().policy());
            ASSERT_EQ(got.size(), size_t(h.B * h.G)) << name;
            for (size_t r = 0; r < got.size(); ++r) {
                std::vector<int32_t> want;
                for (int32_t p = 0; p < 23; ++p)
                    if (p < 5 || p >= 8) want.push_back(p);
                EXPECT_EQ(got[r], want) << name << ": head row " << r << " after the first eviction";
            }
            if (name == base_name) {
                EXPECT_EQ(kept, got) << ada_name << " and " << base_name << " keep different positions after the first eviction";
                continue;
            }
            kept = got;
            // The rule holds once: the next chunk evicts by top-k over all heads' scores.
            const int64_t G = h.G, S = G * h.L;
            const std::vector<float> sc = h.layer().policy().slot_scores();
            const std::vector<int32_t> pos = h.layer().policy().token_positions();
            ASSERT_EQ(sc.size(), size_t(h.B * G * S)) << name;
            h.step(2);
            const SlotPlan& plan = h.layer().replay_log().plans().back();
            for (int64_t b = 0; b < h.B; ++b) {
                const std::vector<double> scb(sc.begin() + b * G * S, sc.begin() + (b + 1) * G * S);
                const std::vector<int32_t> pb(pos.begin() + b * G * S, pos.begin() + (b + 1) * G * S);
                const std::vector<int32_t> ev(plan.targets.begin() + b * G * 2, plan.targets.begin() + (b + 1) * G * 2);
                EXPECT_EQ(sorted(ev), ada_reference(G, S, h.L, scb, pb, 2, 23, 0, 0.2)) << name << ": second eviction, batch row " << b;
            }
        }
    }
}

TEST(AdaKV, RefusesBuffersWithoutThePoolLayout) {
    for (const char* name : {"ada-snapkv-q8", "ada-expected-attention-kivi2"}) {
        KVCacheConfig kc;
        kc.name = name;
        kc.cache_length = 16;
        std::string msg;
        try {
            validate_kv_config(kc, 2, 16, 2);
        } catch (const Error& e) {
            msg = e.what();
        }
        EXPECT_NE(msg.find("runs on the buffers default"), std::string::npos) << name << ": " << msg;
    }
    KVCacheConfig kc;
    kc.name = "ada-snapkv-default";
    kc.cache_length = 16;
    kc.paged_block_size = 8;
    const ModelConfig cfg = preset_config("tiny");
    std::string msg;
    try {
        KVCache c(kc, cfg, Device{}, DType::F32, 64);
    } catch (const Error& e) {
        msg = e.what();
    }
    EXPECT_NE(msg.find("per-head lengths"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kv::test
