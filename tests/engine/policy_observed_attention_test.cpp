// observed-attention against kvpress' ObservedAttentionPress in f64: the attention a token
// received from every query since it entered (softmax weights over the cached tokens, averaged
// over the group's query heads), divided by the number of queries that could see it (P - pos).
#include "policy_references.h"

namespace kv::test {
namespace {

TEST(ObservedAttention, ScoresAndChoicesEqualTheF64Reference) {
    check_policy_against_reference("observed-attention-default", [](KVCacheConfig&) {}, ObservedAttentionReference{});
}

}  // namespace
}  // namespace kv::test
