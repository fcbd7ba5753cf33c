// critical-ada against CriticalAdaKV's definition in f64 (kvpress' CriticalAdaKVPress), written
// as the press does it for one compression of a batch row: (1) budgets: every head's best
// floor(alpha L) slots (its recent ones counting) lifted to +inf, one top-k over all heads' old
// slots by the wrapped scores decides how many each head loses; (2) within a head the best
// floor(first_stage x kept) by the wrapped scores are lifted to +inf too, and (3) the rest go by
// the rescaled scores, lowest first. Random pools, every rule exercised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "engine/core/error.h"
#include "engine/kv/kv_cache.h"
#include "kv_test_util.h"
#include "tests/support/test_support.h"

namespace kv {
std::vector<int32_t> ada_choose_two_stage_for_test(const KVPolicy& p, const std::vector<float>& alloc, const std::vector<float>& sel,
                                                   const std::vector<int32_t>& pos, int64_t n, int64_t P, double fraction);
}

namespace kv::test {
namespace {

// The G n slots of the pool to free (sorted), in f64.
std::vector<int32_t> critical_ada_reference(int64_t G, int64_t S, int64_t L, const std::vector<double>& alloc, const std::vector<double>& sel,
                                            const std::vector<int32_t>& pos, int64_t n, int64_t P, int64_t grace, double alpha, double first) {
    const double inf = INFINITY;
    const int64_t safe = int64_t(std::floor(alpha * double(L)));
    // (1) the budgets: lift each head's safeguard, one bottom-(G n) over all heads' old slots
    std::vector<std::tuple<double, int64_t, int64_t>> all;  // (score, head, slot)
    std::vector<std::vector<int64_t>> own((size_t)G);
    std::vector<int64_t> recent((size_t)G, 0);
    for (int64_t g = 0; g < G; ++g) {
        for (int64_t s = 0; s < S; ++s) {
            const int32_t p = pos[size_t(g * S + s)];
            if (p < 0) continue;
            if (p >= P - grace) ++recent[size_t(g)];
            else own[size_t(g)].push_back(s);
        }
        auto& o = own[size_t(g)];
        std::sort(o.begin(), o.end(), [&](int64_t a, int64_t b) { return alloc[size_t(g * S + a)] > alloc[size_t(g * S + b)]; });
        const int64_t lift = std::clamp<int64_t>(safe - recent[size_t(g)], 0, int64_t(o.size()));
        for (int64_t i = 0; i < int64_t(o.size()); ++i) all.push_back({i < lift ? inf : alloc[size_t(g * S + o[size_t(i)])], g, o[size_t(i)]});
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> lose((size_t)G, 0);
    for (int64_t i = 0; i < G * n; ++i) ++lose[size_t(std::get<1>(all[size_t(i)]))];
    // (2) + (3) per head
    std::vector<int32_t> out;
    for (int64_t g = 0; g < G; ++g) {
        const auto& o = own[size_t(g)];  // best first by the wrapped score
        const int64_t c = int64_t(o.size());
        const int64_t lift = std::clamp<int64_t>(safe - recent[size_t(g)], 0, c);
        const int64_t k1 = int64_t(std::floor(first * double(c - lose[size_t(g)])));
        std::vector<std::pair<double, int64_t>> z;
        for (int64_t i = 0; i < c; ++i) z.push_back({i < std::max(lift, k1) ? inf : sel[size_t(g * S + o[size_t(i)])], o[size_t(i)]});
        std::sort(z.begin(), z.end());
        for (int64_t i = 0; i < lose[size_t(g)]; ++i) out.push_back(int32_t(z[size_t(i)].second));
    }
    std::sort(out.begin(), out.end());
    return out;
}

TEST(CriticalAda, EvictionsEqualTheF64ReferenceOnRandomPools) {
    std::mt19937_64 rng(seed_for("critical-ada reference"));
    std::uniform_real_distribution<double> u(0.0, 10.0);
    int compared = 0, uneven = 0;
    for (int trial = 0; trial < 300; ++trial) {
        const int64_t G = 1 + int64_t(rng() % 4), L = 6 + int64_t(rng() % 10), S = G * L;
        const int64_t grace = int64_t(rng() % 3), n = 1 + int64_t(rng() % 3);
        const double alpha = std::vector<double>{0.0, 0.2, 0.5}[rng() % 3];
        const double first = std::vector<double>{0.0, 0.5, 0.8}[rng() % 3];
        const int64_t need = std::max<int64_t>(grace, int64_t(std::floor(alpha * double(L))));
        if (n > L - need) continue;
        std::vector<int32_t> owner((size_t)S);
        for (int64_t s = 0; s < S; ++s) owner[size_t(s)] = int32_t(s % G);
        std::shuffle(owner.begin(), owner.end(), rng);
        const int64_t P = 3 * L;
        std::vector<int32_t> pos(size_t(G * S), -1);
        for (int64_t s = 0; s < S; ++s) pos[size_t(owner[size_t(s)] * S + s)] = int32_t(P - S + s);
        std::vector<float> af(size_t(G * S)), sf(af.size());
        std::vector<double> ad(af.size()), sd(af.size());
        for (size_t i = 0; i < af.size(); ++i) af[i] = float(u(rng)), sf[i] = float(u(rng)), ad[i] = af[i], sd[i] = sf[i];  // no ties
        KVCacheConfig kc;
        kc.name = "critical-ada-default";
        kc.cache_length = L;
        kc.grace_period = grace;
        kc.policy_options["ada_alpha"] = alpha;
        std::unique_ptr<KVPolicy> pol = make_policy(kc, L, G);
        std::vector<int32_t> got;
        try {
            got = ada_choose_two_stage_for_test(*pol, af, sf, pos, n, P, first);
        } catch (const Error&) {
            continue;  // too few evictable slots in this drawn pool
        }
        std::sort(got.begin(), got.end());
        const std::vector<int32_t> ref = critical_ada_reference(G, S, L, ad, sd, pos, n, P, grace, alpha, first);
        EXPECT_EQ(got, ref) << "trial " << trial << " G " << G << " L " << L << " n " << n << " first " << first;
        // the budgets really move between heads: some head loses other than n
        std::vector<int64_t> per((size_t)G, 0);
        for (int32_t s : ref)
            for (int64_t g = 0; g < G; ++g) per[size_t(g)] += pos[size_t(g * S + s)] >= 0;
        uneven += std::any_of(per.begin(), per.end(), [n](int64_t x) { return x != n; });
        ++compared;
    }
    EXPECT_GE(compared, 150);
    EXPECT_GE(uneven, 50);
}

TEST(CriticalAda, DifferentScoresForBudgetsAndChoiceChangeTheKeptSet) {
    // G 2, L 4, one token (G n = 2 evictions), no safeguard, first stage 0.5: the wrapped scores
    // give head 1 both evictions; within head 1 the rescaled scores pick slots other than the lowest wrapped.
    const int64_t G = 2, L = 4, S = 8, P = 8;
    std::vector<int32_t> pos(size_t(G * S), -1);
    for (int64_t s = 0; s < S; ++s) pos[size_t((s % 2) * S + s)] = int32_t(s);  // head 0: even slots, head 1: odd
    std::vector<float> alloc(size_t(G * S), 0), sel(size_t(G * S), 0);
    const float a0[] = {9, 8, 7, 6}, a1[] = {1, 2, 3, 4}, z1[] = {0.5f, 0.1f, 0.2f, 0.9f};
    for (int i = 0; i < 4; ++i) alloc[size_t(0 * S + 2 * i)] = a0[i], alloc[size_t(1 * S + 2 * i + 1)] = a1[i], sel[size_t(1 * S + 2 * i + 1)] = z1[i];
    KVCacheConfig kc;
    kc.name = "critical-ada-default";
    kc.cache_length = L;
    kc.policy_options["ada_alpha"] = 0.0;
    std::unique_ptr<KVPolicy> pol = make_policy(kc, L, G);
    std::vector<int32_t> got = ada_choose_two_stage_for_test(*pol, alloc, sel, pos, 1, P, 0.5);
    std::sort(got.begin(), got.end());
    // head 1 keeps 2 of 4: stage 1 keeps floor(0.5 * 2) = 1 by the wrapped score (slot 7, a = 4);
    // of slots 1, 3, 5 the rescaled scores 0.5, 0.1, 0.2 evict 3 and 5 (not 1 and 3, the wrapped lowest)
    EXPECT_EQ(got, (std::vector<int32_t>{3, 5}));
}

}  // namespace
}  // namespace kv::test
