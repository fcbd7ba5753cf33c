// cur against kvpress' CURPress in f64 (CurDKV): squared key and value norms from the raw
// k and v, normalised within windows of `w` positions (over the cached tokens of the window),
// combined, divided by the row's sum; the first `sinks` positions score 1.
#include <map>

#include "policy_references.h"

namespace kv::test {
namespace {

TEST(CUR, DefaultScoresAndChoicesEqualTheF64Reference) {
    // kvpress' defaults: 4 sinks, windows of 16 positions, key x value leverage
    check_policy_against_reference("cur-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 4, 16, 3); });
}

TEST(CUR, SmallWindowsAndEveryLeverageKindEqualTheF64Reference) {
    for (int kind : {0, 1, 2}) {
        SCOPED_TRACE(kind);
        check_policy_against_reference(
            "cur-default", [kind](KVCacheConfig& c) { c.policy_options = {{"cur_num_sinks", 1}, {"cur_window", 5}, {"cur_leverage", kind}}; },
            [kind](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 1, 5, kind); });
    }
    check_policy_against_reference(
        "cur-default", [](KVCacheConfig& c) { c.policy_options = {{"cur_num_sinks", 0}, {"cur_window", 0}}; },
        [](const LayerHarness& h, int64_t, int64_t) { return cur_reference(h, 0, 0, 3); });
}

}  // namespace
}  // namespace kv::test
