// observed-attention against kvpress' ObservedAttentionPress in f64: the attention a token
// received from every query since it entered (softmax weights over the cached tokens, averaged
// over the group's query heads), divided by the number of queries that could see it (P - pos).
#include <map>

#include "policy_reference_util.h"

namespace kv::test {
namespace {

TEST(ObservedAttention, ScoresAndChoicesEqualTheF64Reference) {
    std::vector<std::map<int32_t, double>> acc;  // [row][position]: attention received so far
    check_policy_against_reference(
        "observed-attention-default", [](KVCacheConfig&) {},
        [&acc](const LayerHarness& h, int64_t P, int64_t n) {
            const KVPolicy& pol = h.cache->layer(0).policy();
            const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G;
            const auto& pos = pol.token_positions();
            const std::vector<double> qv = h.last_q[0].to_f64_vector();
            acc.resize(size_t(h.B * h.G));
            std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
            for (int64_t r = 0; r < h.B * h.G; ++r) {
                std::map<int32_t, double> next;  // evicted tokens leave
                for (int64_t j = 0; j < T; ++j) next[pos[size_t(r * L + j)]] = acc[size_t(r)][pos[size_t(r * L + j)]];
                for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
                    for (int64_t i = 0; i < n; ++i) {
                        const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                        for (int64_t j = 0; j < T; ++j) next[pos[size_t(r * L + j)]] += a[size_t(j)] / double(R);
                    }
                acc[size_t(r)] = next;
                for (int64_t j = 0; j < T; ++j) {
                    const int32_t p = pos[size_t(r * L + j)];
                    out[size_t(r * L + j)] = next[p] / double(P + n - p);
                }
            }
            return out;
        });
}

}  // namespace
}  // namespace kv::test
