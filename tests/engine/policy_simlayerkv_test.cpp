// simlayerkv against SimLayerKV's definition in f64 (kvpress' SimLayerKVPress.is_lazy): the mean
// over batch rows, query heads and the last `win` queries of the softmax mass on the positions
// p < sinks or p >= P - recent decides the layer (lazy when it exceeds the threshold); a lazy
// layer scores by position (sinks kept), a busy one by SnapKV's published votes of the same
// queries (published_snapkv_reference).
#include <limits>

#include <set>

#include "policy_references.h"
#include "tiny_model_util.h"

namespace kv::test {
namespace {

void check_thresholds(int64_t win) {
    // 0 makes every layer lazy, 1 none (the test is strict), the others whatever the data says:
    // both branches are checked whatever the seed.
    std::vector<int> decisions;
    for (double th : {0.0, 0.3, 0.5, 0.7, 1.0}) {
        const SimLayerRef c{th, 2, 4, win, 3, &decisions};
        check_policy_against_reference(
            "simlayerkv-default",
            [&](KVCacheConfig& k) {
                k.sinks = 2, k.snapkv_kernel = 3;
                k.policy_options = {{"simlayerkv_threshold", th}, {"simlayerkv_recent", 4}, {"simlayerkv_window", double(win)}};
            },
            [&](const LayerHarness& h, int64_t P, int64_t n) { return simlayerkv_reference(h, P, n, c); });
    }
    EXPECT_NE(std::count(decisions.begin(), decisions.end(), 1), 0);
    EXPECT_NE(std::count(decisions.begin(), decisions.end(), 0), 0);
}

TEST(SimLayerKV, ScoresAndChoicesEqualTheF64ReferenceWithOneQuery) { check_thresholds(1); }

TEST(SimLayerKV, ScoresAndChoicesEqualTheF64ReferenceWithAWindowOfThree) { check_thresholds(3); }

TEST(SimLayerKV, TheDefaultsAreKvpresss) {
    KVCacheConfig c;
    EXPECT_EQ(c.policy_option("simlayerkv_window"), 1.0);     // n_last
    EXPECT_EQ(c.policy_option("simlayerkv_recent"), 1024.0);  // n_recent
    EXPECT_EQ(c.sinks, 4);                                    // n_initial
}

TEST(SimLayerKV, ALazyLayerKeepsTheSinksAndTheMostRecentTokens) {
    // threshold 0: every layer is lazy, so after every call the cache holds positions [0, 3)
    // and the L - 3 most recent ones, exactly as a streaming cache with 3 sinks.
    constexpr int64_t L = 16;
    LayerHarness h("simlayerkv-default", L, seed_for("simlayerkv lazy is streaming"));
    h.cfg.sinks = 3;
    h.cfg.policy_options = {{"simlayerkv_threshold", 0.0}, {"simlayerkv_recent", 4}};
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.step(8);  // not a full prefill: no keep-initial rule
    for (int64_t n : {4, 4, 3, 5, 1, 2, 4, 4, 6}) {
        h.step(n);
        if (h.P < L) continue;
        std::vector<int32_t> want = {0, 1, 2};
        for (int64_t x = h.P - (L - 3); x < h.P; ++x) want.push_back(int32_t(x));
        const auto& pos = h.layer().policy().token_positions();
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            std::vector<int32_t> p(pos.begin() + r * L, pos.begin() + (r + 1) * L);
            std::sort(p.begin(), p.end());
            EXPECT_EQ(p, want) << "row " << r << " at " << h.P;
        }
    }
}

std::vector<std::vector<std::set<int32_t>>> tiny_kept_sets(const std::string& name, const std::function<void(KVCacheConfig&)>& setup) {
    return kv::test::tiny_kept_sets(tiny_model<43>(), 5, name, setup);
}

TEST(SimLayerKV, OnTinyEveryLayerLazyIsStreamingAndNoneLazyIsSnapKVOfTheSameQueries) {
    // threshold 0: every layer of `tiny` is lazy (a softmax share is > 0), so each layer and
    // head keeps what streaming keeps; threshold 1: none is (the test is strict), so each keeps
    // what snapkv keeps with the same voting queries and pooling.
    const auto lazy = tiny_kept_sets("simlayerkv-default", [](KVCacheConfig& c) {
        c.sinks = 3, c.policy_options = {{"simlayerkv_threshold", 0.0}, {"simlayerkv_recent", 4}};
    });
    const auto streaming = tiny_kept_sets("streaming-default", [](KVCacheConfig& c) { c.sinks = 3; });
    EXPECT_EQ(lazy, streaming);
    const auto busy = tiny_kept_sets("simlayerkv-default", [](KVCacheConfig& c) {
        c.snapkv_kernel = 3, c.policy_options = {{"simlayerkv_threshold", 1.0}, {"simlayerkv_window", 2}};
    });
    const auto snap = tiny_kept_sets("snapkv-default", [](KVCacheConfig& c) { c.snapkv_kernel = 3, c.snapkv_window = 2; });
    EXPECT_EQ(busy, snap);
    EXPECT_NE(busy, lazy);  // the two rules differ on this sequence, so each comparison can fail
}

}  // namespace
}  // namespace kv::test
