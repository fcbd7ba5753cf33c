// finch against FINCH's definition in f64 (kvpress' FinchPress.score): the chunk's last N queries'
// softmax weights over the cached slots, each multiplied by its query's position p_i (kvpress'
// normalize_scores: arange(k_len - window, k_len)), averaged over the queries and the group's
// query heads; the window's tokens take the layer's largest score + 1.
#include <set>

#include "policy_reference_util.h"
#include "tiny_model_util.h"

namespace kv::test {
namespace {

std::vector<double> finch_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, bool normalize) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, nq = std::min(win, n), first = P + n - nq;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
            for (int64_t i = n - nq; i < n; ++i) {
                const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                const double p = double(P + i);  // the query's position: the keys before it
                for (int64_t j = 0; j < T; ++j) out[size_t(r * L + j)] += (normalize ? p : 1.0) * a[size_t(j)] / double(R * nq);
            }
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < first) top = std::max(top, out[size_t(r * L + j)]);
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= first) out[size_t(r * L + j)] = top + 1;
    return out;
}

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
