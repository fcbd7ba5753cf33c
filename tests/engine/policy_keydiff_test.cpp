// keydiff against KeyDiff's definition in f64 (kvpress' KeyDiffPress): anchor = mean of the
// row's unit keys, score = -cos(key, anchor), over the keys the cache holds after each chunk.
#include "policy_references.h"

namespace kv::test {
namespace {

TEST(KeyDiff, ScoresAndChoicesEqualTheF64Reference) {
    check_policy_against_reference("keydiff-default", [](KVCacheConfig&) {}, [](const LayerHarness& h, int64_t, int64_t) { return keydiff_reference(h); });
}

}  // namespace
}  // namespace kv::test
