// finch against FINCH's definition in f64 (kvpress' FinchPress.score): the chunk's last N queries'
// softmax weights over the cached slots, each multiplied by its query's position p_i (kvpress'
// normalize_scores: arange(k_len - window, k_len)), averaged over the queries and the group's
// query heads; the window's tokens take the layer's largest score + 1.
#include <set>

#include "policy_references.h"
#include "tiny_model_util.h"

namespace kv::test {
namespace {

TEST(Finch, ScoresAndChoicesEqualTheF64Reference) {
    check_policy_against_reference(
        "finch-default", [](KVCacheConfig& c) { c.snapkv_window = 3; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return finch_reference(h, P, n, 3, true); });
}

TEST(Finch, WithoutNormalisationScoresAndChoicesEqualTheF64Reference) {
    check_policy_against_reference(
        "finch-default", [](KVCacheConfig& c) { c.snapkv_window = 2, c.policy_options = {{"finch_normalize", 0}}; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return finch_reference(h, P, n, 2, false); });
}

TEST(Finch, TheDefaultsAreKvpresss) {
    KVCacheConfig c;
    EXPECT_EQ(c.policy_option("finch_normalize"), 1.0);  // normalize_scores=True
}

std::vector<std::vector<std::set<int32_t>>> tiny_kept_sets(const std::string& name, const std::function<void(KVCacheConfig&)>& setup) {
    return kv::test::tiny_kept_sets(tiny_model<47>(), 6, name, setup);
}

TEST(Finch, OnTinyWithoutNormalisationEveryLayerAndHeadKeepsWhatSnapKVWithoutPoolingKeeps) {
    // Without the position factor FINCH's score is SnapKV's vote (the mean instead of the sum
    // over the window: the same order) without pooling: kernel 1. finch recomputes the weights
    // in f64 from the RoPE-rotated queries and keys, snapkv takes the kernel's f32 sums, so this
    // checks the recomputation (rotation, scale, causal mask) against the layer's own attention.
    const auto finch = tiny_kept_sets("finch-default", [](KVCacheConfig& c) { c.snapkv_window = 2, c.policy_options = {{"finch_normalize", 0}}; });
    const auto snap = tiny_kept_sets("snapkv-default", [](KVCacheConfig& c) { c.snapkv_window = 2, c.snapkv_kernel = 1; });
    EXPECT_EQ(finch, snap);
    const auto recent = tiny_kept_sets("streaming-default", [](KVCacheConfig& c) { c.sinks = 0; });
    EXPECT_NE(finch, recent);  // the comparison can fail: the votes keep other tokens than recency
}

}  // namespace
}  // namespace kv::test
