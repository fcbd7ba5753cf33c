// Shared driver of the per-policy formula tests (tests/engine/policy_<name>_test.cpp): a
// 12-slot layer of random q/k/v through a full prefill and chunks; after each chunk the policy's
// scores must equal the test's own f64 reference (called once per chunk, in order; a prefill
// records no attention weights, so a stateful reference starts after it) and the next chunk's
// slots must be the lowest scores, ties by the lower slot. The references themselves live in each test, written from
// the paper's / press's definition.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "kv_test_util.h"

namespace kv::test {

// Key of the token in slot j of row r, from the harness's record of what went in.
inline const std::vector<float>& slot_key(const LayerHarness& h, int64_t r, int64_t j) {
    const auto& pos = h.cache->layer(0).policy().token_positions();
    return h.history[size_t(r)].at(pos[size_t(r * h.L + j)]).first;
}

// Softmax weights in f64 of query i (of the chunk q, starting at position P) of query head hh
// over the T cached slots of row r (causal: slots holding later positions get 0).
inline std::vector<double> ref_attention_row(const LayerHarness& h, const std::vector<double>& qv, int64_t n, int64_t P, int64_t r,
                                             int64_t hh, int64_t i) {
    const KVPolicy& pol = h.cache->layer(0).policy();
    const int64_t T = pol.current_length(), L = h.L, b = r / h.G;
    const auto& pos = pol.token_positions();
    std::vector<double> s((size_t)T, -INFINITY);
    double m = -INFINITY;
    for (int64_t j = 0; j < T; ++j) {
        const int32_t p = pos[size_t(r * L + j)];
        if (p < 0 || p > P + i) continue;
        const auto& key = h.history[size_t(r)].at(p).first;
        double dot = 0;
        for (int64_t d = 0; d < h.D; ++d) dot += qv[size_t(((b * h.NH + hh) * n + i) * h.D + d)] * double(key[size_t(d)]);
        s[size_t(j)] = dot / std::sqrt(double(h.D));
        m = std::max(m, s[size_t(j)]);
    }
    double z = 0;
    for (double& e : s) z += (e = std::exp(e - m));
    for (double& e : s) e /= z;
    return s;
}

// SnapKV's published rule in f64 (SnapKV's code, kvpress' SnapKVPress): the last `win` queries'
// softmax weights (averaged over the group's query heads, summed over the queries) on the
// positions before the window, average-pooled in position order over `k` neighbours with zero
// padding counted (avg_pool1d, count_include_pad); the window's tokens take the maximum over the
// layer (kvpress pads them with scores.max()). Scores per (row, slot) after the chunk [P, P + n).
inline std::vector<double> published_snapkv_reference(const LayerHarness& h, int64_t P, int64_t n, int64_t win, int64_t k) {
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

inline void check_policy_against_reference(const std::string& name, const std::function<void(KVCacheConfig&)>& setup,
                                           const std::function<std::vector<double>(const LayerHarness&, int64_t P, int64_t n)>& ref_of,
                                           const std::vector<int64_t>& chunks = {4, 3, 4, 2, 4, 1, 5, 1}, double tol = 2e-6) {
    constexpr int64_t L = 12;
    LayerHarness h(name, L, seed_for(name + " formula"));
    setup(h.cfg);
    h.cache = std::make_unique<KVCache>(h.cfg, h.model, Device{}, DType::F32, 0, &byte_codec());
    h.cache->set_replay_logging(true);
    h.step(L);
    std::vector<int32_t> expected;
    for (int64_t n : chunks) {
        const int64_t P = h.P;
        h.step(n);
        const SlotPlan& plan = h.layer().replay_log().plans().back();
        if (!expected.empty()) {
            for (int64_t r = 0; r < h.B * h.G; ++r)
                for (int64_t t = 0; t < n; ++t)
                    ASSERT_EQ(plan.targets[size_t(r * n + t)], expected[size_t(r * L + t)]) << name << " row " << r << " at " << P;
        }
        const std::vector<double> ref = ref_of(h, P, n);
        const std::vector<float> got = h.layer().policy().slot_scores();
        ASSERT_EQ(got.size(), ref.size()) << name;
        expected.assign(ref.size(), 0);
        for (int64_t r = 0; r < h.B * h.G; ++r) {
            for (int64_t j = 0; j < L; ++j)
                ASSERT_NEAR(got[size_t(r * L + j)], ref[size_t(r * L + j)], tol * std::max(1.0, std::fabs(ref[size_t(r * L + j)])))
                    << name << " row " << r << " slot " << j << " at " << P;
            std::vector<int32_t> idx(L);
            std::iota(idx.begin(), idx.end(), 0);
            // order by the engine's scores (just checked against the reference): f32 rounding
            // must not turn a reference near-tie into a false failure
            std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return got[size_t(r * L + a)] < got[size_t(r * L + b)]; });
            std::copy(idx.begin(), idx.end(), expected.begin() + r * L);
        }
    }
}

}  // namespace kv::test
