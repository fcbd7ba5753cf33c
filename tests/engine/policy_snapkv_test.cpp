// snapkv and pyramidkv against SnapKV's published rule in f64 (published_snapkv_reference,
// policy_reference_util.h: window votes pooled over the positions before the window only, the
// window kept at the layer's maximum).
#include "policy_reference_util.h"

namespace kv::test {
namespace {

TEST(SnapKV, PublishedRuleScoresAndChoicesEqualTheF64Reference) {
    // window 3, pooling width 3 (chunks of 1 and 2 make the whole chunk the window)
    check_policy_against_reference(
        "snapkv-default", [](KVCacheConfig& c) { c.snapkv_window = 3, c.snapkv_kernel = 3; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return published_snapkv_reference(h, P, n, 3, 3); });
}

TEST(SnapKV, PyramidKVUsesThePublishedRuleToo) {
    check_policy_against_reference(
        "pyramidkv-default", [](KVCacheConfig& c) { c.snapkv_window = 2, c.snapkv_kernel = 5; },
        [](const LayerHarness& h, int64_t P, int64_t n) { return published_snapkv_reference(h, P, n, 2, 5); });
}

TEST(SnapKV, TheWindowIsNeverEvictedUnderThePublishedRule) {
    // After each chunk of 4 with window 4, the next chunk's evictions never hit the chunk just
    // written (its scores are the layer's maximum, so at most ties with an older token).
    LayerHarness h("snapkv-default", 16, seed_for("snapkv window kept"));
    h.cfg.snapkv_window = 4;
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_replay_logging(true);
    h.step(16);
    int64_t checked = 0;
    for (int s = 0; s < 12; ++s) {
        const auto pos = h.layer().policy().token_positions();
        const int64_t P = h.P;
        h.step(4);
        if (s == 0) continue;  // the keep-initial rule after the full prefill
        const SlotPlan& plan = h.layer().replay_log().plans().back();
        for (int64_t r = 0; r < h.B * h.G; ++r)
            for (int64_t t = 0; t < 4; ++t, ++checked) EXPECT_LT(pos[size_t(r * 16 + plan.targets[size_t(r * 4 + t)])], P - 4) << "row " << r;
    }
    EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace kv::test
