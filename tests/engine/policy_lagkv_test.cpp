// lagkv against kvpress' LagKVPress in f64, applied to the cached tokens in position order as the
// press's sequence: n_sink sinks, blocks of lag tokens each scored by the softmax over the block of
// the unbiased std over channels of (x - min ref) / (max ref - min ref) (ref: the next block), keys
// and values averaged; ranked within the block / lag unless cross scoring; sinks and the last
// block with the remainder score 1; a sequence shorter than n_sink + 2 lag scores by age.
#include "policy_references.h"

namespace kv::test {
namespace {

TEST(LagKV, BlockScoresAndChoicesEqualTheF64Reference) {
    // 12 cached tokens: sink 1, blocks of 3 -> blocks at 1 and 4 scored, 7.. the reference and tail
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 1}, {"lagkv_lag", 3}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 1, 3, false); });
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 0}, {"lagkv_lag", 2}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 0, 2, false); });
}

TEST(LagKV, CrossScoringEqualsTheF64Reference) {
    check_policy_against_reference(
        "lagkv-default", [](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 2}, {"lagkv_lag", 2}, {"lagkv_cross", 1}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 2, 2, true); });
}

TEST(LagKV, ShortSequenceKeepsTheNewestAsKvpress) {
    // kvpress' defaults (4 sinks, blocks of 128) on 12 tokens: no block is scored, the newest stay
    check_policy_against_reference("lagkv-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return lagkv_reference(h, 4, 128, false); });
}

TEST(LagKV, BlocksLongerThanEightTokensEqualTheF64Reference) {
    // 40 cached tokens, blocks of 9 and 11 (the per-token sums run 8 tokens at a time, then the
    // rest), over head widths 16 (a power of two: the mean's 1 / D is exact) and 12
    for (const int64_t D : {16, 12})
        for (const int64_t lag : {9, 11}) {
            SCOPED_TRACE(str("D ", D, ", lag ", lag));
            LayerHarness h("lagkv-default", 40, seed_for(str("lagkv long blocks ", D, " ", lag)), 0, D);
            compare_policy_with_reference(
                h, "lagkv-default", [lag](KVCacheConfig& c) { c.policy_options = {{"lagkv_sinks", 1}, {"lagkv_lag", double(lag)}}; },
                [lag](const LayerHarness& hh, int64_t, int64_t) { return lagkv_reference(hh, 1, lag, false); }, {4, 3, 4, 2, 4, 1, 5, 1},
                2e-6);
        }
}

}  // namespace
}  // namespace kv::test
