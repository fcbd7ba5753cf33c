// Ada-KV (ada-snapkv, ada-expected-attention) and the per-head lengths under it: the eviction
// rule against a hand-computed case and an f64 reference written as kvpress' AdaKVPress does it
// (safeguarded slots lifted to +inf, then one top-k over all heads); the memory tracker counts
// exactly the pool's kept slots; per-head counts really differ. The registry loops
// (kv_registry_test, kv_invariants_test, grad_fd_test, generation_decode_test) cover replay,
// invariants, FD gradients and decode eviction.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
    // alpha 0.75: floor(0.75 * 4) = 3 per head; head 0 keeps its best old slot (0.4, slot 6),
    // so the 4th eviction is head 1's lowest (5, slot 1).
    EXPECT_EQ(sorted(ada_choose_evictions_for_test(*ada("ada-snapkv-default", 4, 2, 0.75, 0), sc, pos, 2, 8)),
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
        const int64_t S = p.pool_slots();
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
