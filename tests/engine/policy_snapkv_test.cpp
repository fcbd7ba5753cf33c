// snapkv and pyramidkv against SnapKV's published rule in f64 (SnapKV's code, kvpress'
// SnapKVPress): the last `win` queries' softmax weights (averaged over the group's query heads,
// summed over the queries) on the positions before the window, average-pooled in position order
// over `k` neighbours with zero padding counted (avg_pool1d, count_include_pad); the window's
// tokens take the maximum over the layer (kvpress pads them with scores.max()).
#include "policy_reference_util.h"

namespace kv::test {
namespace {

std::vector<double> published_snapkv_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, int64_t k) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, R = h.NH / h.G, nq = std::min(win, n), first = P + n - nq;
    const auto& pos = pol.token_positions();
    const std::vector<double> qv = h.last_q[0].to_f64_vector();
    std::vector<double> out((size_t)(h.B * h.G * L), 0.0);
    double top = -INFINITY;
    for (int64_t r = 0; r < h.B * h.G; ++r) {
        std::vector<double> w((size_t)T, 0.0);
        for (int64_t hh = (r % h.G) * R; hh < (r % h.G + 1) * R; ++hh)
            for (int64_t i = n - nq; i < n; ++i) {
                const std::vector<double> a = ref_attention_row(h, qv, n, P, r, hh, i);
                for (int64_t j = 0; j < T; ++j) w[size_t(j)] += a[size_t(j)] / double(R);
            }
        // the positions before the window, in order; the pooling sees nothing past them
        std::vector<std::pair<int32_t, int64_t>> before;
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] < first) before.push_back({pos[size_t(r * L + j)], j});
        std::sort(before.begin(), before.end());
        const int64_t m = int64_t(before.size());
        for (int64_t i = 0; i < m; ++i) {
            double acc = 0;
            for (int64_t o = i - k / 2; o <= i + k / 2; ++o)
                if (o >= 0 && o < m) acc += w[size_t(before[size_t(o)].second)];
            top = std::max(top, out[size_t(r * L + before[size_t(i)].second)] = acc / double(k));
        }
    }
    for (int64_t r = 0; r < h.B * h.G; ++r)
        for (int64_t j = 0; j < T; ++j)
            if (pos[size_t(r * L + j)] >= first) out[size_t(r * L + j)] = top;
    return out;
}

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
